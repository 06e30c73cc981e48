"""Message-queue agents (``protocol: "mq"``) on a real redis-server: an ATP caller reaches them exactly as it
reaches HTTP agents, plain and streaming; the capability's instances share its request stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conftest import wait_for
from stream_support import read_stream


@pytest.fixture
async def mq_mesh(start_mesh, redis_server):
    return await start_mesh(router_settings={"broker": redis_server.url})


def mq_echo(make_agent, mesh, broker: str, agent_id: str, name: str = "mq.echo", **options: Any):
    """An SDK agent serving ``name`` from the broker; every payload its handler ran with goes in ``ran``."""
    agent = make_agent(agent_id, mesh.registry.url, broker=broker, service=options.pop("service", "mq-echo"),
                       **options.pop("agent", {}))
    ran: list[Any] = []

    @agent.capability(name, protocol="mq", **options)
    async def echo(payload, ctx):
        ran.append(payload)
        await asyncio.sleep(float(payload.get("delay_s", 0)) if isinstance(payload, dict) else 0)
        return {"echo": payload, "served_by": agent_id, "request_id": ctx.request_id}

    return agent, ran


async def test_mq_agents_answer_atp_callers_many_at_once_sharing_the_stream(mq_mesh, make_agent, redis_server):
    first, ran_first = mq_echo(make_agent, mq_mesh, redis_server.url, "mq-1")
    second, ran_second = mq_echo(make_agent, mq_mesh, redis_server.url, "mq-2")
    await first.start()
    await second.start()
    await mq_mesh.until_state("mq-1")
    await mq_mesh.until_state("mq-2")
    registered = mq_mesh.router.mirror.instances["mq-1"].capabilities[0]
    assert (registered.protocol, registered.endpoint) == ("mq", f"{redis_server.url}/agentreach.mq-echo.mq.echo")
    answers = await asyncio.gather(*(mq_mesh.call("mq.echo", {"n": n, "delay_s": 0.05}, request_id=f"many-{n}")
                                     for n in range(40)))
    assert [answer.status for answer in answers] == [200] * 40
    assert [answer.body["result"]["echo"]["n"] for answer in answers] == list(range(40))
    assert [answer.body["result"]["request_id"] for answer in answers] == [f"many-{n}" for n in range(40)]
    assert len(ran_first) + len(ran_second) == 40
    assert ran_first and ran_second, "one instance took every call: the group shares none"
    metrics = await mq_mesh.get("/metrics")
    assert 'agentreach_router_attempts_total{outcome="ok",protocol="mq"} 40.0' in metrics, metrics
    assert "agentreach_router_mq_duplicates_total 0.0" in metrics
    await redis_server.until_acknowledged("agentreach.mq-echo.mq.echo")  # every call acknowledged


async def test_an_mq_agent_streams_its_chunks_in_order_to_a_streaming_caller(mq_mesh, make_agent, http, redis_server):
    agent = make_agent("mq-stream-1", mq_mesh.registry.url, broker=redis_server.url)

    @agent.capability("mq.words", protocol="mq")
    async def words(payload, ctx):
        for word in payload["text"].split():
            yield word

    await agent.start()
    await mq_mesh.until_state("mq-stream-1")
    text = " ".join(f"w{n}" for n in range(50))
    streamed = await read_stream(http, f"{mq_mesh.url}/atp", {"capability": "mq.words", "request_id": "words-1",
                                                              "payload": {"text": text}})
    assert streamed.status == 200
    assert [chunk["data"] for chunk in streamed.chunks] == text.split()
    assert [chunk["seq"] for chunk in streamed.chunks] == list(range(50))
    name, final = streamed.final
    assert (name, final["status"], final["result"]) == ("response", "success", "w49")
    plain = await mq_mesh.call("mq.words", {"text": "only the last"})
    assert (plain.status, plain.body["result"]) == (200, "last")


async def test_a_caller_leaving_an_mq_stream_cancels_the_handler(mq_mesh, make_agent, http, redis_server):
    agent = make_agent("mq-gone-1", mq_mesh.registry.url, broker=redis_server.url)
    cancelled = asyncio.Event()

    @agent.capability("mq.ticks", protocol="mq")
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
    await mq_mesh.until_state("mq-gone-1")

    async def leave(streamed) -> bool:
        return len(streamed.chunks) >= 3

    streamed = await read_stream(http, f"{mq_mesh.url}/atp", {"capability": "mq.ticks", "request_id": "mq-gone"},
                                 on_chunk=leave)
    assert len(streamed.chunks) == 3
    await asyncio.wait_for(cancelled.wait(), 5.0)
    await wait_for(lambda: agent.inflight.count == 0, timeout=2.0, what="the call to leave the agent")
    await wait_for(lambda: agent.mq.counts["cancelled"] == 1, timeout=2.0, what="the cancel to be counted")
    trace = (await mq_mesh.get("/traces/mq-gone"))["call"]
    assert trace["error_code"] == "CANCELLED" and trace["chunks"] >= 3

    # The agent counts the cancel, then acknowledges the entry: it is not redelivered.
    await redis_server.until_acknowledged("agentreach.mq-gone-1.mq.ticks", "the cancelled call's entry", timeout=2.0)


async def test_business_errors_usage_and_context_updates_cross_the_broker(mq_mesh, make_agent, redis_server):
    from agent_reach import BusinessFailure

    agent = make_agent("mq-biz-1", mq_mesh.registry.url, broker=redis_server.url)

    @agent.capability("mq.biz", protocol="mq")
    async def biz(payload, ctx):
        if payload == "refuse":
            raise BusinessFailure("not_today", "no refunds on Sundays")
        ctx.report_usage(input_tokens=12, output_tokens=3)
        ctx.update_context(step=2)
        return "done"

    await agent.start()
    await mq_mesh.until_state("mq-biz-1")
    refused = await mq_mesh.call("mq.biz", "refuse")
    assert refused.body["error_code"] == "BUSINESS_ERROR"
    assert refused.body["business_error"] == {"code": "not_today", "message": "no refunds on Sundays"}
    done = await mq_mesh.call("mq.biz", "go")
    assert done.status == 200 and done.body["result"] == "done"
    assert done.body["context_update"]["step"] == 2
    assert done.body["usage"]["input_tokens"] == 12 and done.body["usage"]["output_tokens"] == 3


async def test_a_router_without_the_agents_broker_fails_the_call_unsent(start_mesh, make_agent, redis_server):
    mesh = await start_mesh()  # no --broker
    agent, ran = mq_echo(make_agent, mesh, redis_server.url, "mq-nobroker-1")
    await agent.start()
    await mesh.until_state("mq-nobroker-1")
    answer = await mesh.call("mq.echo", "hello")
    assert answer.body["error_code"] == "AGENT_ERROR", answer.body
    assert "no broker for mq agents" in answer.body["error_message"]
    assert ran == []
