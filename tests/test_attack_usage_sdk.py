"""Attacks on an SDK handler's usage report: counts that are no token count (NaN, infinity, a fraction, a bool,
past what sums exactly). A real registry, router and SDK agent on 127.0.0.1."""

from __future__ import annotations

from agent_reach.usage import MAX_TOKENS

from conftest import wait_for
from sdk_support import agent_view

NOT_COUNTS = [float("nan"), float("inf"), 2.5, True, -1, MAX_TOKENS + 1]


async def test_a_count_that_is_no_token_count_fails_in_the_handler_and_leaves_heartbeats_alone(mesh, make_agent):
    agent = make_agent("llm-odd-1", mesh.registry.url)
    refused: list[object] = []

    @agent.capability("llm.odd")
    async def odd(payload, ctx):
        for value in NOT_COUNTS:
            for counts in ({"input_tokens": value}, {"output_tokens": value}):
                try:
                    ctx.report_usage(**counts)
                except ValueError:
                    refused.append(value)
        ctx.report_usage(input_tokens=3)
        return "done"

    await agent.start()
    await mesh.until_state("llm-odd-1")
    answer = await mesh.call("llm.odd")
    assert answer.status == 200, answer.body
    # The router would drop a usage holding any of these whole: the handler hears of its mistake instead.
    assert answer.body["usage"] == {"input_tokens": 3, "output_tokens": 0, "cost": None}
    assert len(refused) == 2 * len(NOT_COUNTS), refused

    # NaN in the agent's token counter was sent as null, and the registry refused every heartbeat after it.
    async def counted() -> bool:
        view = await agent_view(mesh.http, mesh.registry.url, "llm-odd-1")
        return view is not None and (view.get("metrics") or {}).get("tokens") == 3

    await wait_for(counted, timeout=5, what="a heartbeat counting the 3 tokens reported")
