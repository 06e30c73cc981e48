"""Attacks on how the router reads an agent's answer: JSON nested past what a decoder can follow (a usage object
nested thousands deep, say). A real router and scripted agents on 127.0.0.1, rest and ATP, whole and streamed."""

from __future__ import annotations

import pytest
from aiohttp import web

from recording_support import starting
from stream_support import StreamingRestAgent

DEPTH = 5000
DEEP = b"[" * DEPTH + b"]" * DEPTH


@pytest.mark.parametrize(("protocol", "body"), [
    ("rest", b'{"text": "hi", "usage": ' + DEEP + b"}"),
    ("rest", DEEP),
    ("atp", b'{"request_id": "r", "status": "success", "result": 1, "usage": ' + DEEP + b"}"),
])
async def test_an_answer_nested_too_deep_is_the_agents_malformed_answer_not_the_routers_failure(
        start_mesh, start_scripted, protocol, body):
    mesh = await start_mesh()
    agent = await start_scripted("deep-1", protocol=protocol)
    agent.body = body
    await mesh.add(agent, "deep.cap")
    answer = await mesh.call("deep.cap", {"q": 1})
    assert answer.body["error_code"] == "AGENT_ERROR", answer.body
    assert "malformed" in answer.body["error_message"]


@pytest.mark.parametrize("event", [b"data: " + DEEP + b"\n\n", b"event: response\ndata: " + DEEP + b"\n\n"])
async def test_a_streamed_event_nested_too_deep_is_the_agents_malformed_answer(start_mesh, event):
    mesh = await start_mesh()

    async def script(response: web.StreamResponse) -> None:
        await response.write(event)

    async with starting(StreamingRestAgent) as start:
        agent = await start("deep-stream-1", script)
        await mesh.add(agent, "deep.stream")
        answer = await mesh.call("deep.stream", {"q": 1})
    assert answer.body["error_code"] == "AGENT_ERROR", answer.body
    assert "malformed" in answer.body["error_message"]
