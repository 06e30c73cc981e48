"""WebSocket agents (``protocol: "websocket"``): an ATP caller reaches them exactly as it reaches HTTP agents,
plain and streaming, through the router's one kept connection per instance endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agent_reach.admission import Limits
from agent_reach.socket_wire import Envelope, decode, encode

from conftest import wait_for
from stream_support import read_stream


def socket_echo(make_agent, mesh, agent_id: str, name: str = "ws.echo", **options: Any):
    """An SDK agent serving ``name`` over WebSocket; every payload its handler ran with goes in ``ran``."""
    agent = make_agent(agent_id, mesh.registry.url)
    ran: list[Any] = []

    @agent.capability(name, protocol="websocket", **options)
    async def echo(payload, ctx):
        ran.append(payload)
        await asyncio.sleep(float(payload.get("delay_s", 0)) if isinstance(payload, dict) else 0)
        return {"echo": payload, "served_by": agent_id, "request_id": ctx.request_id}

    return agent, ran


async def test_an_sdk_agent_over_websocket_answers_atp_callers_many_at_once(mesh, make_agent):
    agent, ran = socket_echo(make_agent, mesh, "ws-1")
    await agent.start()
    await mesh.until_state("ws-1")
    registered = mesh.router.mirror.instances["ws-1"].capabilities[0]
    assert (registered.protocol, registered.endpoint) == ("websocket", f"{agent.base_url}/ws/ws.echo")
    answers = await asyncio.gather(*(mesh.call("ws.echo", {"n": n, "delay_s": 0.05}, request_id=f"many-{n}")
                                     for n in range(40)))
    assert [answer.status for answer in answers] == [200] * 40
    assert [answer.body["result"]["echo"]["n"] for answer in answers] == list(range(40))
    assert [answer.body["result"]["request_id"] for answer in answers] == [f"many-{n}" for n in range(40)]
    assert len(ran) == 40
    metrics = await mesh.get("/metrics")
    assert 'agentreach_router_attempts_total{outcome="ok",protocol="websocket"} 40.0' in metrics, metrics
    assert "agentreach_router_websocket_connections 1.0" in metrics  # one kept connection carried all 40


async def test_a_websocket_agent_streams_its_chunks_to_a_streaming_caller(mesh, make_agent, http):
    agent = make_agent("ws-stream-1", mesh.registry.url)

    @agent.capability("ws.words", protocol="websocket")
    async def words(payload, ctx):
        for word in payload["text"].split():
            yield word

    await agent.start()
    await mesh.until_state("ws-stream-1")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "ws.words", "request_id": "words-1",
                                                           "payload": {"text": "one two three four"}})
    assert streamed.status == 200
    assert [chunk["data"] for chunk in streamed.chunks] == ["one", "two", "three", "four"]
    assert [chunk["seq"] for chunk in streamed.chunks] == [0, 1, 2, 3]
    name, final = streamed.final
    assert (name, final["status"], final["result"]) == ("response", "success", "four")
    plain = await mesh.call("ws.words", {"text": "only the last"})
    assert (plain.status, plain.body["result"]) == (200, "last")


async def test_a_caller_leaving_a_websocket_stream_cancels_the_handler(mesh, make_agent, http):
    agent = make_agent("ws-gone-1", mesh.registry.url)
    cancelled = asyncio.Event()

    @agent.capability("ws.ticks", protocol="websocket")
    async def ticks(payload, ctx):
        n = 0
        try:
            while True:
                yield n
                n += 1
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await agent.start()
    await mesh.until_state("ws-gone-1")

    async def leave(streamed) -> bool:
        return len(streamed.chunks) >= 3

    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "ws.ticks", "request_id": "ws-gone"},
                                 on_chunk=leave)
    assert len(streamed.chunks) == 3
    await asyncio.wait_for(cancelled.wait(), 2.0)
    await wait_for(lambda: agent.inflight.count == 0, timeout=2.0, what="the call to leave the agent")
    trace = (await mesh.get("/traces/ws-gone"))["call"]
    assert trace["error_code"] == "CANCELLED" and trace["chunks"] >= 3


async def test_business_errors_usage_and_context_updates_cross_the_socket(mesh, make_agent):
    from agent_reach import BusinessFailure

    agent = make_agent("ws-biz-1", mesh.registry.url)

    @agent.capability("ws.biz", protocol="websocket")
    async def biz(payload, ctx):
        if payload == "refuse":
            raise BusinessFailure("not_today", "no refunds on Sundays")
        ctx.report_usage(input_tokens=12, output_tokens=3)
        ctx.update_context(step=2)
        return "done"

    await agent.start()
    await mesh.until_state("ws-biz-1")
    refused = await mesh.call("ws.biz", "refuse")
    assert refused.body["error_code"] == "BUSINESS_ERROR"
    assert refused.body["business_error"] == {"code": "not_today", "message": "no refunds on Sundays"}
    done = await mesh.call("ws.biz", "go")
    assert done.status == 200 and done.body["result"] == "done"
    assert done.body["context_update"]["step"] == 2
    assert done.body["usage"]["input_tokens"] == 12 and done.body["usage"]["output_tokens"] == 3


async def test_an_sdk_agent_drops_what_no_router_sends_and_serves_on(mesh, make_agent, http, router_logs):
    agent, ran = socket_echo(make_agent, mesh, "ws-robust-1")
    await agent.start()
    async with http.ws_connect(f"{agent.base_url}/ws/ws.echo") as socket:
        await socket.send_str("text is not this protocol")
        await socket.send_bytes(b"x" * 20_000)  # no envelope line at all
        await socket.send_bytes(b'{"type":"reply","id":"r"}\n{}')  # the agent's own kind of message
        await socket.send_bytes(b'{"type":"call","id":""}\n{}')  # no id
        await socket.send_bytes(b"[" * 100_000 + b"\n")  # nested past any need
        slow = json.dumps({"capability": "ws.echo", "payload": {"delay_s": 0.3}, "request_id": "dup"}).encode()
        await socket.send_bytes(encode(Envelope(type="call", id="dup"), slow))
        await socket.send_bytes(encode(Envelope(type="call", id="dup"), slow))  # the same id while in flight
        envelope, frame = decode((await socket.receive(timeout=5)).data)
    assert (envelope.type, envelope.id, envelope.status) == ("reply", "dup", 200)
    assert json.loads(frame)["result"]["echo"] == {"delay_s": 0.3}
    assert ran == [{"delay_s": 0.3}]
    whys = [line["why"] for line in router_logs.named("websocket_message_refused")]
    assert len(whys) == 6 and "a call with this id is in flight already" in whys, whys


async def test_a_quiet_socket_outlives_the_agents_header_deadline(mesh, make_agent, http):
    """A WebSocket is no request whose header is late: the guard's header deadline once closed an idle router
    connection (and the calls on it) 10 s after its last message."""
    agent = make_agent("ws-quiet-1", mesh.registry.url)

    @agent.capability("ws.quiet", protocol="websocket")
    async def echo(payload, ctx):
        return payload

    await agent.start()

    async def call(socket, request_id: str) -> int:
        body = json.dumps({"capability": "ws.quiet", "payload": 1, "request_id": request_id}).encode()
        await socket.send_bytes(encode(Envelope(type="call", id=request_id), body))
        return decode((await socket.receive(timeout=5)).data)[0].status

    async with http.ws_connect(f"{agent.base_url}/ws/ws.quiet") as socket:
        assert await call(socket, "q-1") == 200
        with pytest.raises(TimeoutError):  # nothing comes, not even a close, past the header deadline
            await socket.receive(timeout=Limits().header_timeout + 1)
        assert await call(socket, "q-2") == 200
