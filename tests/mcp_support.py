"""The official MCP SDK's client (Streamable HTTP) against the real router: one connected with given headers;
`agentreach mcp add` run as an operator would, and the failover check every kind of MCP server must pass."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import wait_for
from test_cli_security import agentreach


@contextlib.asynccontextmanager
async def mcp_client(url: str, headers: dict[str, str] | None = None,
                     message_handler: Any = None) -> AsyncIterator[Client]:
    """An MCP client connected (initialized) to the server at ``url``, sending ``headers`` on every request;
    ``message_handler`` sees what the server sends unasked (notifications)."""
    async with httpx2.AsyncClient(headers=headers or {}, timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http), message_handler=message_handler) as client:
        yield client


async def add_server(mesh, url: str, *extra: str) -> dict[str, Any]:
    """`agentreach mcp add` the server at ``url`` as service calc (capabilities calc.*); its JSON answer."""
    result = await agentreach("mcp", "add", url, "--service", "calc", "--prefix", "calc.", "--registry",
                              mesh.registry.url, "--data-dir", "/nonexistent", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def fail_over_then_evict(mesh, first: Any, second: Any) -> None:
    """Two servers of calc (their add tool answers their name as ``server``) share its calls; ``first`` killed,
    every call is answered by ``second``, and ``first`` is evicted while ``second`` stays healthy."""
    one = (await add_server(mesh, first.url, "--agent-id", "calc-a"))["agent_id"]
    two = (await add_server(mesh, second.url, "--agent-id", "calc-b"))["agent_id"]
    await mesh.ready(one, two)
    served = {(await mesh.call("calc.add", {"a": 1, "b": 1})).body["result"]["server"] for _ in range(8)}
    assert served == {"calc-a", "calc-b"}
    await first.kill()
    answers = [await mesh.call("calc.add", {"a": 1, "b": 1}) for _ in range(6)]
    assert {(a.status, a.body["result"]["server"]) for a in answers} == {(200, "calc-b")}
    registry = mesh.registry.registry
    await wait_for(lambda: registry.status(one, registry.clock()).value == "evicted", timeout=15,
                   what="the killed MCP server to be evicted")
    assert registry.status(two, registry.clock()).value == "healthy"
