"""Streams with authentication on: a caller's credentials are checked as for any call (a refusal keeps its
status and headers), and a streamed call the router signs is served by an agent that verifies it."""

from __future__ import annotations

from agent_reach import ReachClient
from agent_reach.sse import ChunkFrame

from stream_support import read_stream


async def test_a_refused_stream_keeps_its_status_and_challenge(secure, http):
    mesh, _ = secure
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "echo", "payload": 1})
    assert streamed.status == 401 and streamed.content_type == "text/event-stream"
    assert streamed.chunks == [] and streamed.final[1]["error_code"] == "UNAUTHENTICATED"
    async with http.post(f"{mesh.url}/atp", json={"capability": "echo"}, headers={"Accept": "text/event-stream"}) \
            as answer:
        assert answer.headers["WWW-Authenticate"] == 'Bearer realm="agentreach"'


async def test_a_signed_stream_reaches_an_agent_that_verifies_calls(token_mesh, make_agent):
    issued = await token_mesh.token("signed")
    agent = make_agent("signed-1", token_mesh.registry.url, registration_token=issued["token"])

    @agent.capability("signed.count")
    async def count(payload, ctx):
        for n in range(payload):
            yield n

    await agent.start()
    await token_mesh.routable("signed-1")
    async with ReachClient(token_mesh.router.url) as client:
        items = [item async for item in client.stream("signed.count", 3)]
    assert [item.data for item in items if isinstance(item, ChunkFrame)] == [0, 1, 2]
    assert items[-1].result == 2
