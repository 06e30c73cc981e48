"""The mcp SDK's widely deployed 1.x line against the mesh, both ways: its client (ClientSession over
streamablehttp_client) through the router's /mcp with a bearer token, plain and streaming, and its FastMCP
server added with `agentreach mcp add` and called through the router, two of them failing over, a killed one
evicted (its MCP ping unanswered). The main venv has the 2.x line, so the 1.x side runs in .venv-mcp1 (made by
scripts/install-test-tools) as subprocesses: tests/mcp1x/."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_for
from mcp_support import add_server, fail_over_then_evict
from sdk_support import free_port
from storage_support import ROOT
from test_mcp_out import ADD_INPUT, SUM_OUTPUT, tools_mesh

__all__ = ["tools_mesh"]  # the fixture, shared with test_mcp_out.py

SCRIPTS = Path(__file__).parent / "mcp1x"
# The 1.x side must not see the project: no PYTHONPATH pointing into this checkout.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def python_1x() -> Path:
    python = ROOT / ".venv-mcp1" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run scripts/install-test-tools to make the mcp 1.x venv")
    return python


async def client_1x(url: str, headers: dict[str, str] | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    """What the 1.x client saw (tests/mcp1x/client.py): the SDK's version, the session, the tools, each call."""
    spec = {"url": url, "headers": headers or {}, "calls": list(calls)}
    process = await asyncio.create_subprocess_exec(
        python_1x(),
        SCRIPTS / "client.py",
        json.dumps(spec),
        env=ENV,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["sdk"].startswith("1."), seen["sdk"]
    return seen


class Server1x:
    """A FastMCP server process (tests/mcp1x/server.py) serving at ``url``."""

    def __init__(self, process: asyncio.subprocess.Process, url: str):
        self.process, self.url = process, url

    async def kill(self) -> None:
        """Stop it; returns once the process has exited (its port refuses connections)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        await self.process.wait()


@pytest.fixture
async def start_server_1x(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Server1x]]]:
    """Start FastMCP servers on loopback, each returned once it accepts connections; all stopped at teardown."""
    servers: list[Server1x] = []

    async def start(name: str, *options: str) -> Server1x:
        port, log_path = free_port(), tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                python_1x(), SCRIPTS / "server.py", str(port), name, *options, env=ENV, stdout=log, stderr=log
            )
        servers.append(Server1x(process, f"http://127.0.0.1:{port}/mcp"))

        async def accepting() -> bool:
            assert process.returncode is None, log_path.read_text()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return False
            writer.close()
            return True

        await wait_for(accepting, timeout=30, what=f"the 1.x MCP server {name} to listen")
        return servers[-1]

    yield start
    for server in servers:
        await server.kill()


def results(seen: dict[str, Any]) -> list[dict[str, Any]]:
    return [call["result"] for call in seen["calls"]]


async def test_the_1x_client_lists_the_tools_and_calls_one_plain_and_streaming_with_a_bearer_token(tools_mesh):
    mesh, headers, _, calls = tools_mesh
    seen = await client_1x(
        f"{mesh.url}/mcp",
        headers,
        {"tool": "tools.add", "arguments": {"a": 2, "b": 3}},
        {"tool": "tools.count", "arguments": {"n": 3}, "progress": True},
    )
    assert (seen["server"], seen["protocol_version"]) == ("agentreach", seen["asked"])
    tools = {tool["name"]: tool for tool in seen["tools"]}
    assert set(tools) == {"tools.add", "tools.count", "tools.fail"}
    assert (tools["tools.add"]["inputSchema"], tools["tools.add"]["outputSchema"]) == (ADD_INPUT, SUM_OUTPUT)
    assert tools["tools.add"]["annotations"]["idempotentHint"] is True
    added, counted = results(seen)
    assert (added["isError"], added["structuredContent"]) == (False, {"sum": 5}) and calls == [{"a": 2, "b": 3}]
    [row] = (await mesh.get(f"/audit?request_id={added['_meta']['agentreach/request_id']}"))["entries"]
    assert (row["outcome"], row["caller_name"]) == ("success", "granted")
    progress = seen["calls"][1]["progress"]
    assert [(value, json.loads(message)) for value, message in progress] == [
        (1, {"n": 0}),
        (2, {"n": 1}),
        (3, {"n": 2}),
    ]
    assert (counted["isError"], counted["structuredContent"]) == (False, {"n": 2})
    trace = (await mesh.get(f"/traces/{counted['_meta']['agentreach/request_id']}"))["call"]
    assert (trace["streamed"], trace["chunks"]) == (True, 3)


async def test_the_1x_client_without_the_grant_sees_no_tool_and_a_direct_call_is_refused(tools_mesh):
    mesh, _, other, calls = tools_mesh
    seen = await client_1x(f"{mesh.url}/mcp", other, {"tool": "tools.add", "arguments": {"a": 1, "b": 1}})
    assert seen["tools"] == []
    [refused] = seen["calls"]
    assert refused["error"]["code"] == -32602 and refused["error"]["data"]["error_code"] == "FORBIDDEN"
    assert calls == []


async def initialized_as(http, url: str) -> tuple[str, bool]:
    """How a server answers initialize: its content type, and whether it names a session."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    async with http.post(url, json=body, headers={"Accept": "application/json, text/event-stream"}) as response:
        assert response.status == 200, await response.text()
        return response.content_type, "Mcp-Session-Id" in response.headers


@pytest.mark.parametrize(
    ("options", "answers"),
    [((), ("text/event-stream", True)), (("--stateless-json",), ("application/json", False))],
    ids=["sessions-sse", "stateless-json"],
)
async def test_a_1x_server_added_with_mcp_add_is_called_by_atp_and_1x_mcp_callers(
    start_mesh, start_server_1x, options, answers
):
    mesh = await start_mesh(health_interval=0.2)
    url = (await start_server_1x("calc-1x", *options)).url
    assert await initialized_as(mesh.http, url) == answers
    added = await add_server(mesh, url)
    assert sorted(added["capabilities"]) == ["calc.add", "calc.echo"]
    await mesh.until_state(added["agent_id"])  # the registry's MCP ping reaches the 1.x server
    answer = await mesh.call("calc.add", {"a": 2, "b": 3})
    assert (answer.status, answer.body["result"]) == (200, {"sum": 5, "server": "calc-1x"})
    echoed = await mesh.call("calc.echo", {"text": "hi"})
    assert (echoed.status, echoed.body["result"]) == (200, {"result": "hi"})
    # The 1.x server's declared schema (pydantic's, with titles) is the router's to check.
    refused = await mesh.call("calc.add", {"a": 2, "b": "three"})
    assert (refused.status, refused.body["error_code"], refused.body["field"]) == (400, "INVALID_PAYLOAD", "payload.b")
    seen = await client_1x(f"{mesh.url}/mcp", None, {"tool": "calc.add", "arguments": {"a": 4, "b": 5}})
    assert results(seen)[0]["structuredContent"] == {"sum": 9, "server": "calc-1x"}


async def test_two_1x_servers_fail_over_and_a_killed_one_is_evicted(start_mesh, start_server_1x):
    mesh = await start_mesh(health_interval=0.2, silence_timeout=1.0, evict_after=2)
    first, second = await start_server_1x("calc-a"), await start_server_1x("calc-b")
    await fail_over_then_evict(mesh, first, second)
