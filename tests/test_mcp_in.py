"""MCP servers in the mesh: an official mcp SDK server (MCPServer over Streamable HTTP on loopback) added with
`agentreach mcp add` is called by an ATP caller and by an MCP client through the router; isError results are
business errors; two servers of one service fail over; a killed one is demoted and evicted like any instance."""

from __future__ import annotations

import asyncio

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from conftest import wait_for
from mcp_support import add_server, fail_over_then_evict, mcp_client
from sdk_support import loopback_socket, run_uvicorn
from test_cli_security import agentreach


def calculator(name: str) -> MCPServer:
    server = MCPServer(name)

    @server.tool(description="Adds two integers")
    def add(a: int, b: int) -> dict[str, int | str]:
        return {"sum": a + b, "server": name}

    @server.tool(description="Always fails")
    def broken() -> str:
        raise ToolError("the widget is out of stock")

    return server


class Running:
    def __init__(self, server, url: str, port: int):
        self.server, self.url, self.port = server, url, port

    async def kill(self) -> None:
        """Stop serving; returns once the port refuses connections."""
        self.server.should_exit = True

        async def refused() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return True
            writer.close()
            return False

        await wait_for(refused, what="the MCP server to stop")


@pytest.fixture
async def start_calculator(teardown):
    async def start(name: str = "calc-a") -> Running:
        sock = loopback_socket()
        port = sock.getsockname()[1]
        server = await teardown.enter_async_context(run_uvicorn(calculator(name).streamable_http_app(), sock))
        return Running(server, f"http://127.0.0.1:{port}/mcp", port)
    return start


async def test_an_mcp_server_joins_in_one_command_and_is_called_by_atp_and_mcp_callers(start_mesh,
                                                                                      start_calculator):
    mesh = await start_mesh(health_interval=0.2)
    calc = await start_calculator()
    added = await add_server(mesh, calc.url)
    assert sorted(added["capabilities"]) == ["calc.add", "calc.broken"]
    view = mesh.registry.registry.agent(added["agent_id"])
    capability = next(each for each in view.capabilities if each.name == "calc.add")
    assert (capability.protocol, capability.endpoint) == ("mcp", f"{calc.url}#add")
    assert capability.input_schema["required"] == ["a", "b"] and capability.description == "Adds two integers"
    await mesh.until_state(added["agent_id"])  # no heartbeats: the registry's MCP ping says it is alive
    answer = await mesh.call("calc.add", {"a": 2, "b": 3})
    assert (answer.status, answer.body["result"]) == (200, {"sum": 5, "server": "calc-a"})
    # The declared schema is the router's to check: a bad payload never reaches the server.
    refused = await mesh.call("calc.add", {"a": 2, "b": "three"})
    assert (refused.status, refused.body["error_code"], refused.body["field"]) == (400, "INVALID_PAYLOAD", "payload.b")
    failed = await mesh.call("calc.broken", {})
    assert failed.body["error_code"] == "BUSINESS_ERROR" and "out of stock" in failed.body["business_error"]["message"]
    async with mcp_client(f"{mesh.url}/mcp") as client:
        result = await client.call_tool("calc.add", {"a": 4, "b": 5})
        broken = await client.call_tool("calc.broken", {})
    assert result.structured_content == {"sum": 9, "server": "calc-a"}
    assert broken.is_error and "out of stock" in broken.content[0].text


async def test_only_the_chosen_tools_are_registered_and_an_unknown_one_is_refused(start_mesh, start_calculator):
    mesh = await start_mesh()
    calc = await start_calculator()
    assert (await add_server(mesh, calc.url, "--tool", "add"))["capabilities"] == ["calc.add"]
    result = await agentreach("mcp", "add", calc.url, "--service", "calc", "--tool", "nope", "--registry",
                              mesh.registry.url, "--data-dir", "/nonexistent")
    assert result.returncode == 2 and "has no tool 'nope'; it lists add, broken" in result.stderr


async def test_two_servers_fail_over_and_a_killed_one_is_demoted_then_evicted(start_mesh, start_calculator):
    mesh = await start_mesh(health_interval=0.2, silence_timeout=1.0, evict_after=2)
    first, second = await start_calculator("calc-a"), await start_calculator("calc-b")
    await fail_over_then_evict(mesh, first, second)
