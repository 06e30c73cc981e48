"""GET /mcp: a session's stream of what the router sends unasked, `notifications/tools/list_changed` when the
tools the caller may call change, and only then; the stream closes when its session ends or its credential
stops being valid; the official SDK's client receives the notification."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp import types

from mcp_support import mcp_client
from oauth_support import bearer, token_for
from router.mcp import endpoint
from router_support import wait_for

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
NOTICE = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def offered(name: str) -> dict[str, object]:
    return {"name": name, "endpoint": "http://127.0.0.1:9/atp", "protocol": "atp"}


@pytest.fixture
async def mcp_mesh(start_mesh):
    """Auth on; a client granted tools.*, another granted other.*."""
    mesh = await start_mesh(auth=True)
    granted = await mesh.new_client(["tools.*"], name="granted")
    other = await mesh.new_client(["other.*"], name="other")
    await mesh.register("tools-1", [offered("tools.first")], service="tools")
    return mesh, granted, other


async def begin(mesh, headers) -> str:
    async with mesh.http.post(f"{mesh.url}/mcp", json=INIT, headers=headers) as response:
        assert response.status == 200, await response.text()
        return response.headers["Mcp-Session-Id"]


async def tool_names(mesh, headers) -> set[str]:
    async with mesh.http.post(f"{mesh.url}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                              headers=headers) as response:
        return {tool["name"] for tool in (await response.json())["result"]["tools"]}


class Stream:
    """The session's GET stream, read in the background: the JSON-RPC messages it carried, and whether it ended."""

    def __init__(self, response):
        self.response = response
        self.messages: list[dict[str, object]] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for line in self.response.content:
            if line.startswith(b"data: "):
                self.messages.append(json.loads(line[len(b"data: "):]))


@pytest.fixture
async def open_stream(mcp_mesh):
    mesh = mcp_mesh[0]
    opened = []

    async def open_(headers, session):
        response = await mesh.http.get(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": session})
        assert (response.status, response.headers["Content-Type"]) == (200, "text/event-stream"), \
            await response.text()
        opened.append(Stream(response))
        return opened[-1]

    yield open_
    for stream in opened:
        stream.reader.cancel()
        stream.response.close()


async def test_the_stream_notifies_when_the_callers_tools_change_and_only_then(mcp_mesh, open_stream):
    mesh, granted, other = mcp_mesh
    headers = {"X-API-Key": granted["api_key"]}
    stream = await open_stream(headers, await begin(mesh, headers))
    # A capability this caller may not call changes nothing it sees: the stream wakes and stays quiet.
    await mesh.register("other-1", [offered("other.hidden")], service="other")
    await wait_for(lambda: mesh.router.mirror.offers("other.hidden") is not None, timeout=5,
                   what="the router to learn other.hidden")
    assert "other.hidden" in await tool_names(mesh, {"X-API-Key": other["api_key"]})
    await mesh.register("tools-2", [offered("tools.second")], service="tools")
    await wait_for(lambda: stream.messages, timeout=5, what="a list_changed notification")
    assert await tool_names(mesh, headers) == {"tools.first", "tools.second"}
    await mesh.deregister("tools-2")
    await wait_for(lambda: len(stream.messages) == 2, timeout=5, what="a second notification")
    assert stream.messages == [NOTICE, NOTICE]
    assert await tool_names(mesh, headers) == {"tools.first"}


async def test_the_stream_closes_when_its_session_ends_or_its_credential_is_disabled(mcp_mesh, open_stream):
    mesh, granted, other = mcp_mesh
    headers = {"X-API-Key": granted["api_key"]}
    session = await begin(mesh, headers)
    stream = await open_stream(headers, session)
    async with mesh.http.delete(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": session}) as response:
        assert response.status == 204
    await asyncio.wait_for(stream.reader, 5)
    assert stream.messages == []

    other_headers = bearer(await token_for(mesh, other))
    stream = await open_stream(other_headers, await begin(mesh, other_headers))
    await mesh.client_action(other["client_id"], "disable")
    await asyncio.wait_for(stream.reader, 5)  # the disabling is a change: the stream re-checks its credential


async def test_a_stream_needs_its_callers_live_session_and_a_session_has_one(mcp_mesh, open_stream):
    mesh, granted, other = mcp_mesh
    headers = {"X-API-Key": granted["api_key"]}
    session = await begin(mesh, headers)
    for sent, status, code in [({}, 400, "missing_session"), ({"Mcp-Session-Id": "nope"}, 404, "unknown_session"),
                               ({"X-API-Key": other["api_key"], "Mcp-Session-Id": session}, 404, "unknown_session")]:
        async with mesh.http.get(f"{mesh.url}/mcp", headers={**headers, **sent}) as response:
            assert (response.status, (await response.json())["error"]) == (status, code)
    await open_stream(headers, session)
    async with mesh.http.get(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": session}) as response:
        assert (response.status, (await response.json())["error"]) == (409, "stream_open")
    async with mesh.http.get(f"{mesh.url}/mcp") as response:
        assert response.status == 401


async def test_the_sdk_client_receives_the_notification(mcp_mesh):
    mesh, granted, _ = mcp_mesh
    changed = asyncio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mcp_client(f"{mesh.url}/mcp", bearer(await token_for(mesh, granted)), on_message) as client:
        assert client.server_capabilities.tools.list_changed is True
        async def stream_open() -> bool:
            return "agentreach_mcp_streams_open 1.0" in (await mesh.get("/metrics")).splitlines()
        await wait_for(stream_open, timeout=5, what="the client to open its stream")
        await mesh.register("tools-2", [offered("tools.second")], service="tools")
        await asyncio.wait_for(changed.wait(), 5)
        assert {tool.name for tool in (await client.list_tools()).tools} == {"tools.first", "tools.second"}


async def test_one_client_cannot_hold_more_than_its_share_of_streams(mcp_mesh, open_stream, monkeypatch):
    monkeypatch.setattr(endpoint, "MAX_STREAMS_PER_CLIENT", 2)
    mesh, granted, other = mcp_mesh
    headers = {"X-API-Key": granted["api_key"]}
    sessions = [await begin(mesh, headers) for _ in range(3)]
    first = await open_stream(headers, sessions[0])
    await open_stream(headers, sessions[1])
    async with mesh.http.get(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": sessions[2]}) as response:
        assert (response.status, (await response.json())["error"]) == (429, "too_many_streams")
    other_headers = {"X-API-Key": other["api_key"]}
    await open_stream(other_headers, await begin(mesh, other_headers))  # another client is not held back
    async with mesh.http.delete(f"{mesh.url}/mcp", headers={**headers, "Mcp-Session-Id": sessions[0]}) as response:
        assert response.status == 204
    await asyncio.wait_for(first.reader, 5)
    await open_stream(headers, sessions[2])  # a closed stream's place is free again
