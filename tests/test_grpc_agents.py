"""gRPC agents (``protocol: "grpc"``): an ATP caller reaches them exactly as it reaches HTTP agents, plain and
streaming, through one reused channel per instance endpoint; the registry probes them with grpc.health.v1."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_reach.dispatch import BusinessFailure

from stream_support import read_stream


def grpc_echo(make_agent, mesh, agent_id: str, name: str = "grpc.echo", **options: Any):
    """An SDK agent serving ``name`` over gRPC; every payload its handler ran with goes in ``ran``."""
    agent = make_agent(agent_id, mesh.registry.url)
    ran: list[Any] = []

    @agent.capability(name, protocol="grpc", **options)
    async def echo(payload, ctx):
        ran.append(payload)
        await asyncio.sleep(float(payload.get("delay_s", 0)) if isinstance(payload, dict) else 0)
        return {"echo": payload, "served_by": agent_id, "request_id": ctx.request_id}

    return agent, ran


async def test_an_sdk_agent_over_grpc_answers_atp_callers_many_at_once(mesh, make_agent):
    agent, ran = grpc_echo(make_agent, mesh, "grpc-1")
    await agent.start()
    await mesh.until_state("grpc-1")
    record = mesh.router.mirror.instances["grpc-1"]
    assert (record.capabilities[0].protocol, record.capabilities[0].endpoint) == ("grpc", agent.grpc_address)
    assert record.health_url == f"grpc://{agent.grpc_address}"
    answers = await asyncio.gather(*(mesh.call("grpc.echo", {"n": n, "delay_s": 0.05}, request_id=f"many-{n}")
                                     for n in range(40)))
    assert [answer.status for answer in answers] == [200] * 40
    assert [answer.body["result"]["echo"]["n"] for answer in answers] == list(range(40))
    assert [answer.body["result"]["request_id"] for answer in answers] == [f"many-{n}" for n in range(40)]
    assert len(ran) == 40
    metrics = await mesh.get("/metrics")
    assert 'agentreach_router_attempts_total{outcome="ok",protocol="grpc"} 40.0' in metrics, metrics
    assert "agentreach_router_grpc_channels 1.0" in metrics  # one reused channel carried all 40


async def test_a_grpc_agent_streams_its_chunks_to_a_streaming_caller(mesh, make_agent, http):
    agent = make_agent("grpc-stream-1", mesh.registry.url)

    @agent.capability("grpc.words", protocol="grpc")
    async def words(payload, ctx):
        for word in payload["text"].split():
            yield word

    await agent.start()
    await mesh.until_state("grpc-stream-1")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "grpc.words", "request_id": "words-1",
                                                           "payload": {"text": "one two three four"}})
    assert streamed.status == 200
    assert [chunk["data"] for chunk in streamed.chunks] == ["one", "two", "three", "four"]
    assert [chunk["seq"] for chunk in streamed.chunks] == [0, 1, 2, 3]
    name, final = streamed.final
    assert (name, final["status"], final["result"]) == ("response", "success", "four")
    plain = await mesh.call("grpc.words", {"text": "only the last"})
    assert (plain.status, plain.body["result"]) == (200, "last")


async def test_business_errors_usage_and_context_updates_cross_grpc_as_over_http(mesh, make_agent):
    agent = make_agent("grpc-frames-1", mesh.registry.url)

    @agent.capability("grpc.frames", protocol="grpc")
    async def frames(payload, ctx):
        if payload == "decline":
            raise BusinessFailure("NO_STOCK", "nothing left", {"sku": 7})
        ctx.report_usage(input_tokens=12, output_tokens=3)
        ctx.update_context(step=2)
        return {"seen_context": ctx.context.get("trip")}

    await agent.start()
    await mesh.until_state("grpc-frames-1")
    declined = await mesh.call("grpc.frames", "decline")
    assert declined.body["business_error"] == {"code": "NO_STOCK", "message": "nothing left", "details": {"sku": 7}}
    answered = await mesh.call("grpc.frames", "go", context={"trip": "t-1"})
    assert answered.status == 200, answered.body
    assert answered.body["result"] == {"seen_context": "t-1"}
    assert answered.body["context_update"]["step"] == 2
    assert (answered.body["usage"]["input_tokens"], answered.body["usage"]["output_tokens"]) == (12, 3)
