"""The mesh as an MCP server, called by the official MCP SDK's client over Streamable HTTP through the real
router: tools are the capabilities a caller may call, a tool call is an ATP call with the caller's credentials
(plain and streaming), and bad input is answered with the JSON-RPC error the spec names."""

from __future__ import annotations

import asyncio
import json

import pytest
from agent_reach.dispatch import BusinessFailure
from mcp.shared.exceptions import MCPError

from mcp_support import mcp_client
from oauth_support import bearer, token_for
from sdk_support import issue_token

ADD_INPUT = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"]}
SUM_OUTPUT = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}


@pytest.fixture
async def tools_mesh(start_mesh, make_agent, http, tmp_path):
    """A mesh with authentication on; one SDK agent serving tools.add, tools.count (streams) and tools.fail;
    a client granted tools.*, another granted only other.*."""
    mesh = await start_mesh(auth=True, router_settings={"audit_path": tmp_path / "audit.db"})
    token = await issue_token(http, mesh.registry.url, mesh.admin_key, "tools")
    agent = make_agent("tools-1", mesh.registry.url, service="tools", registration_token=token["token"])
    calls: list[object] = []

    @agent.capability("tools.add", description="Adds two integers", input_schema=ADD_INPUT,
                      output_schema=SUM_OUTPUT, idempotent=True, max_payload_bytes=256)
    async def add(payload, ctx):
        calls.append(payload)
        return {"sum": payload["a"] + payload["b"]}

    @agent.capability("tools.count", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    async def count(payload, ctx):
        for n in range(payload["n"]):
            yield {"n": n}

    @agent.capability("tools.fail")
    async def fail(payload, ctx):
        raise BusinessFailure("out_of_stock", "No more widgets")

    await agent.start()
    await mesh.until_state("tools-1")
    granted = await mesh.new_client(["tools.*"], name="granted")
    other = await mesh.new_client(["other.*"], name="other")
    return mesh, bearer(await token_for(mesh, granted)), bearer(await token_for(mesh, other)), calls


async def test_a_client_lists_the_tools_and_calls_one_with_a_bearer_token(tools_mesh):
    mesh, headers, _, calls = tools_mesh
    async with mcp_client(f"{mesh.url}/mcp", headers) as client:
        assert client.server_info.name == "agentreach"
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == {"tools.add", "tools.count", "tools.fail"}
        assert (tools["tools.add"].description, tools["tools.add"].input_schema) == ("Adds two integers", ADD_INPUT)
        assert tools["tools.add"].output_schema == SUM_OUTPUT and tools["tools.add"].annotations.idempotent_hint
        assert tools["tools.fail"].input_schema == {"type": "object", "additionalProperties": True}
        result = await client.call_tool("tools.add", {"a": 2, "b": 3})
    assert not result.is_error and result.structured_content == {"sum": 5}
    assert json.loads(result.content[0].text) == {"sum": 5} and calls == [{"a": 2, "b": 3}]
    request_id = result.meta["agentreach/request_id"]
    # The same path as /atp: traced and audited under the caller's client.
    trace = (await mesh.get(f"/traces/{request_id}"))["call"]
    assert trace["outcome"] == "success"
    [row] = (await mesh.get(f"/audit?request_id={request_id}"))["entries"]
    assert (row["outcome"], row["caller_name"], row["instance"]) == ("success", "granted", "tools-1")


async def test_a_streaming_capability_sends_progress_for_each_chunk(tools_mesh):
    mesh, headers, _, _ = tools_mesh
    seen: list[tuple[float, str | None]] = []

    async def progress(value, total, message):
        seen.append((value, message))

    async with mcp_client(f"{mesh.url}/mcp", headers) as client:
        result = await client.call_tool("tools.count", {"n": 3}, progress_callback=progress)
    assert [(value, json.loads(message)) for value, message in seen] == [(1, {"n": 0}), (2, {"n": 1}), (3, {"n": 2})]
    assert not result.is_error and result.structured_content == {"n": 2}
    trace = (await mesh.get(f"/traces/{result.meta['agentreach/request_id']}"))["call"]
    assert (trace["streamed"], trace["chunks"]) == (True, 3)


async def test_a_business_error_is_a_tool_result_with_is_error(tools_mesh):
    mesh, headers, _, _ = tools_mesh
    async with mcp_client(f"{mesh.url}/mcp", headers) as client:
        result = await client.call_tool("tools.fail", {})
    assert result.is_error and result.content[0].text == "out_of_stock: No more widgets"
    assert result.meta["agentreach/business_error"]["code"] == "out_of_stock"


async def test_a_caller_without_the_grant_sees_no_tool_and_a_direct_call_is_refused(tools_mesh):
    mesh, _, other, calls = tools_mesh
    async with mcp_client(f"{mesh.url}/mcp", other) as client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError) as refused:
            await client.call_tool("tools.add", {"a": 1, "b": 1})
    assert refused.value.error.code == -32602 and refused.value.error.data["error_code"] == "FORBIDDEN"
    assert calls == []
    audit = await mesh.get(f"/audit?request_id={refused.value.error.data['request_id']}")
    assert [row["error_code"] for row in audit["entries"]] == ["FORBIDDEN"]


async def test_without_a_credential_the_answer_is_401_naming_the_metadata(tools_mesh):
    mesh, _, _, _ = tools_mesh
    async with mesh.http.post(f"{mesh.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as response:
        assert response.status == 401
        challenge = response.headers["WWW-Authenticate"]
    assert f'resource_metadata="{mesh.url}/.well-known/oauth-protected-resource/mcp"' in challenge
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        async with mesh.http.get(f"{mesh.url}{path}") as response:
            metadata = await response.json()
        assert metadata["resource"] == f"{mesh.url}/mcp" and metadata["token_endpoint"] == f"{mesh.url}/oauth/token"
    # An API key is accepted as on /atp.
    granted = await mesh.new_client(["tools.*"], name="keyed")
    async with mcp_client(f"{mesh.url}/mcp", {"X-API-Key": granted["api_key"]}) as client:
        assert (await client.call_tool("tools.add", {"a": 1, "b": 1})).structured_content == {"sum": 2}


async def rpc(mesh, headers, body, *, raw: bytes | None = None, session: str | None = None):
    sent = {**headers, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session is not None:
        sent["Mcp-Session-Id"] = session
    data = raw if raw is not None else json.dumps(body).encode()
    async with mesh.http.post(f"{mesh.url}/mcp", data=data, headers=sent) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None, response.headers


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b'{"jsonrpc": "2.0", "id": 1, "method": ', 400, -32700),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', 400, -32600),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": {"no": 1}, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list"}', 200, -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 3}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "tools.add", "arguments": 4}}', 200,
     -32602),
])
async def test_malformed_messages_get_json_rpc_errors(tools_mesh, raw, status, code):
    mesh, headers, _, _ = tools_mesh
    got, body, _ = await rpc(mesh, headers, None, raw=raw)
    assert (got, body["error"]["code"]) == (status, code) and body["error"]["message"]


async def test_bad_tool_calls_are_invalid_params_and_nothing_else_is_disturbed(tools_mesh):
    mesh, headers, _, calls = tools_mesh
    async with mcp_client(f"{mesh.url}/mcp", headers) as client:
        for name, arguments, said in [
            ("tools.nope", {}, "Unknown tool"),
            ("tools.add", {"a": 1, "b": "x" * 300}, "accepts at most 256"),
            ("tools.add", {"a": 1, "b": "two"}, "payload.b"),
            ("tools.add", {"a": 1}, "'b' is a required property"),
            ("bad name!", {}, "capability must be a capability name"),
        ]:
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, arguments)
            assert refused.value.error.code == -32602 and said in refused.value.error.message, name
        # The session and the router carry on.
        assert (await client.call_tool("tools.add", {"a": 4, "b": 5})).structured_content == {"sum": 9}
    assert calls == [{"a": 4, "b": 5}]


async def test_sessions_belong_to_the_client_that_began_them(tools_mesh):
    mesh, headers, other, _ = tools_mesh
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    status, body, answer_headers = await rpc(mesh, headers, init)
    assert (status, body["result"]["protocolVersion"]) == (200, "2025-06-18")
    session = answer_headers["Mcp-Session-Id"]
    assert (await rpc(mesh, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session=session))[0] \
        == 202
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    assert (await rpc(mesh, headers, ping, session=session))[:2] == (200, {"jsonrpc": "2.0", "id": 2, "result": {}})
    status, body, _ = await rpc(mesh, other, ping, session=session)
    assert (status, body["error"]["code"]) == (404, -32001)
    async with mesh.http.delete(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": session}) as response:
        assert response.status == 204
    assert (await rpc(mesh, headers, ping, session=session))[0] == 404
    async with mesh.http.get(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": session}) as response:
        assert response.status == 404  # an ended session has no stream either


async def test_a_caller_leaving_a_streamed_tool_call_cancels_it(start_mesh, make_agent):
    mesh = await start_mesh()
    agent = make_agent("slow-1", mesh.registry.url)
    left = asyncio.Event()

    @agent.capability("slow.stream", timeout_sla_ms=10_000)
    async def slow(payload, ctx):
        try:
            yield 0
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            left.set()
            raise

    await agent.start()
    await mesh.until_state("slow-1")
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "slow.stream", "arguments": {}, "_meta": {"progressToken": "p"}}}
    async with mesh.http.post(f"{mesh.url}/mcp", json=call,
                              headers={"Accept": "application/json, text/event-stream"}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = await response.content.readuntil(b"\n\n")
        assert b'"notifications/progress"' in first
    await asyncio.wait_for(left.wait(), 10)
