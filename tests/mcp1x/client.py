"""The mcp SDK's 1.x client (run by .venv-mcp1's python, never importing the project): connects over Streamable
HTTP with the given headers, lists the tools, makes the given calls (each with a progress callback when asked)
and prints one JSON line of what it saw, the SDK's version and the protocol version it asked for included, so a
test on the 2.x line can check the 1.x client's view.

Usage: client.py SPEC, SPEC a JSON object: {"url": ..., "headers": {...}, "calls": [{"tool": ..., "arguments":
{...}, "progress": true|false}]}. Each call's entry is its result as the SDK parsed it (by alias), with the
progress it was told of, or the JSON-RPC error it raised.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from mcp.types import LATEST_PROTOCOL_VERSION


async def call(session: ClientSession, spec: dict[str, Any]) -> dict[str, Any]:
    progress: list[list[Any]] = []

    async def told(value: float, total: float | None, message: str | None) -> None:
        progress.append([value, message])

    try:
        result = await session.call_tool(
            spec["tool"], spec.get("arguments", {}), progress_callback=told if spec.get("progress") else None
        )
    except McpError as error:
        return {"error": error.error.model_dump(mode="json", exclude_none=True)}
    return {"result": result.model_dump(mode="json", by_alias=True, exclude_none=True), "progress": progress}


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    async with (
        streamablehttp_client(spec["url"], headers=spec.get("headers", {}), timeout=30) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        initialized = await session.initialize()
        tools = (await session.list_tools()).tools
        return {
            "sdk": version("mcp"),
            "asked": LATEST_PROTOCOL_VERSION,
            "server": initialized.serverInfo.name,
            "protocol_version": initialized.protocolVersion,
            "tools": [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools],
            "calls": [await call(session, each) for each in spec.get("calls", [])],
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
