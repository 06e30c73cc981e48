"""Attacks on the per-session token cap (context.session_id + context.token_budget): a budget already overspent,
as a nested call made through the SDK carries it once its caller used more than it had. A real registry, router
and metered agent on 127.0.0.1."""

from __future__ import annotations

import pytest

from test_budgets_routers import budgeted, metered, routers, spend  # noqa: F401 (a fixture)


@pytest.mark.parametrize("left", [0, -1, -10_000])
async def test_a_session_with_no_tokens_left_is_refused_even_at_a_router_new_to_it(
        start_mesh, metered, left):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1)
    key = await budgeted([mesh])
    # The SDK sends what the caller has left (its token_budget minus what it spent): past its budget, below 0.
    refused = await spend(mesh, key, context={"session_id": "s-over", "token_budget": left})
    assert refused.status == 429 and refused.body["error_code"] == "BUDGET_EXHAUSTED", refused.body
    assert mesh.router.decisions["session_budget_exhausted"] == 1
    # A session with tokens left is still served.
    assert (await spend(mesh, key, context={"session_id": "s-fresh", "token_budget": 100})).status == 200
