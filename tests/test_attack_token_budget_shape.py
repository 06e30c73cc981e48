"""Attacks on context.token_budget's shape: a session cap that is no integer (a string, a fraction, a bool, a number
past what a token count can be) was ignored, so the session went uncapped where the caller meant a cap. Refused at
the edge instead, naming the field, as a routing_hint of the wrong shape is. A real registry, router and agent."""

from __future__ import annotations

import pytest
from agent_reach.atp import valid_token_budget
from agent_reach.context import CallContext, outgoing_context, serving
from agent_reach.usage import MAX_TOKENS

from router_support import Mesh

NOT_TOKEN_COUNTS = ["500", 500.0, 12.5, True, False, [500], {"tokens": 500}, 2**53, -(2**53)]


@pytest.mark.parametrize("cap", NOT_TOKEN_COUNTS)
async def test_a_token_budget_that_is_no_integer_is_refused_naming_the_field(mesh: Mesh, start_agent, cap):
    agent = await start_agent("capped")
    await mesh.add(agent)
    answer = await mesh.call(payload=1, context={"session_id": "s-1", "token_budget": cap}, request_id="cap-1")
    assert (answer.status, answer.body["error_code"], answer.body["field"]) == \
        (400, "INVALID_FRAME", "context.token_budget"), answer.body
    assert answer.body["request_id"] == "cap-1" and agent.calls == 0


@pytest.mark.parametrize("cap", [None, 0, -5, 500, 2**53 - 1])
async def test_an_integer_or_null_token_budget_is_taken(mesh: Mesh, start_agent, cap):
    agent = await start_agent("capped")
    await mesh.add(agent)
    answer = await mesh.call(payload=1, context={"session_id": "s-1", "token_budget": cap})
    assert answer.status == (429 if cap is not None and cap <= 0 else 200), answer.body


def test_the_sdk_never_sends_a_token_budget_the_router_refuses():
    """What a nested call carries is what its caller has left: the caller's spend, or a callee's, past its budget by
    more than a token count can be (two counts of 2^53-1) still goes out as a budget the router takes (429, not 400)."""
    call = CallContext("r-1", "planner", {"session_id": "s-1", "token_budget": 1000})
    call.report_usage(MAX_TOKENS, MAX_TOKENS)
    with serving(call):
        context = outgoing_context()
    assert valid_token_budget(context) and context["token_budget"] == -MAX_TOKENS, context["token_budget"]
