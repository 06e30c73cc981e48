"""An SDK handler reports usage with one call; through the real router the caller gets it priced at the
prices the SDK agent declared, streamed or not, and the router's ledger counts it."""

from __future__ import annotations

import pytest

from stream_support import read_stream


async def start_priced_agent(mesh, make_agent):
    agent = make_agent("llm-sdk-1", mesh.registry.url)

    @agent.capability("llm.sdk", cost_per_call=0.5, cost_per_1k_input_tokens=2.0, cost_per_1k_output_tokens=4.0)
    async def chat(payload, ctx):
        ctx.report_usage(input_tokens=payload["in"], output_tokens=payload["out"])  # a first model call
        ctx.report_usage(input_tokens=500)  # a second one
        return "done"

    @agent.capability("llm.sdk.stream", cost_per_1k_output_tokens=8.0)
    async def stream(payload, ctx):
        for word in ("a", "b", "c"):
            ctx.report_usage(output_tokens=125)
            yield word

    @agent.capability("llm.sdk.quiet")
    async def quiet(payload, ctx):
        return "no usage"

    await agent.start()
    await mesh.until_state("llm-sdk-1")
    return agent


async def test_a_handlers_reported_usage_reaches_the_caller_priced(mesh, make_agent):
    await start_priced_agent(mesh, make_agent)
    answer = await mesh.call("llm.sdk", {"in": 1500, "out": 250})
    assert answer.status == 200, answer.body
    assert answer.body["result"] == "done"
    assert answer.body["usage"] == {"input_tokens": 2000, "output_tokens": 250, "cost": 0.5 + 4.0 + 1.0}
    assert "usage" not in (await mesh.call("llm.sdk.quiet")).body
    (hour,) = (await mesh.get("/usage?period=hour&capability=llm.sdk"))["periods"]
    assert hour["by_instance"] == {"llm-sdk-1": {"calls": 1, "input_tokens": 2000, "output_tokens": 250,
                                                 "cost": 5.5}}


async def test_a_streaming_handlers_usage_is_in_the_final_frame(mesh, make_agent):
    await start_priced_agent(mesh, make_agent)
    streamed = await read_stream(mesh.http, f"{mesh.url}/atp", {"capability": "llm.sdk.stream", "payload": None})
    assert streamed.status == 200 and [chunk["data"] for chunk in streamed.chunks] == ["a", "b", "c"]
    name, final = streamed.final
    assert name == "response" and final["usage"] == {"input_tokens": 0, "output_tokens": 375, "cost": 3.0}
    whole = await mesh.call("llm.sdk.stream")  # a caller that does not stream gets the same usage
    assert (whole.body["result"], whole.body["usage"]) == ("c", final["usage"])


def test_a_negative_count_or_price_fails_loudly_in_the_agent(make_agent):
    from agent_reach.context import CallContext
    with pytest.raises(ValueError, match="negative"):
        CallContext("r", "cap", {}).report_usage(input_tokens=-1)
    agent = make_agent("bad-price", "http://127.0.0.1:9")
    with pytest.raises(Exception, match="cost_per_call"):
        agent.capability("llm.bad", cost_per_call=-1)
