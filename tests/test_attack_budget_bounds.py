"""Attacks on budgets with usage at the edge of what the registry accepts: an agent reporting the largest token
counts a usage may carry (or priced past the largest cost a budget holds). A real registry, routers following it
over HTTP and a metered agent on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest
from agent_reach.usage import MAX_TOKENS

from conftest import call, wait_for
from router.core import RouterSettings
from test_budgets_routers import budgeted, metered, routers, spend  # noqa: F401 (a fixture)

FAST_REPORTS = RouterSettings(budget_report_seconds=0.05)


async def account(http, mesh, client_id: str) -> dict[str, Any]:
    status, body = await call(http, "GET", f"{mesh.registry.url}/budgets/{client_id}", mesh.admin_key)
    assert status == 200, body
    return dict(body)


@pytest.mark.parametrize(("budget", "prices", "huge", "spent"), [
    ({"budget_tokens": 1000}, {}, {"in": MAX_TOKENS, "out": MAX_TOKENS}, "spent_tokens"),
    ({"budget_cost": 10.0}, {"cost_per_1k_input_tokens": 1e12}, {"in": 2_000_000, "out": 0}, "spent_cost"),
])
async def test_a_spend_past_what_a_lease_request_carries_still_reaches_the_account(
        start_mesh, metered, http, budget, prices, huge, spent):  # noqa: F811 (the fixture imported)
    meshes = await routers(start_mesh, metered, routing=FAST_REPORTS, **prices)
    key = await budgeted(meshes, budget_period="day", **budget)
    client_id = next(iter(meshes[0].registry.registry.state.auth.clients))
    assert (await spend(meshes[0], key, huge)).status == 200

    # The call used far more than the whole budget: the registry hears of it (capped at what it can count) ...
    limit = next(iter(budget.values()))
    reported = await wait_for(lambda: _spent_past(http, meshes[0], client_id, spent, limit), timeout=5,
                              what="the router to report the spend past the budget")
    assert reported >= limit
    # ... so both routers refuse the client until the period resets (not "cannot be asked": the account is dry).
    for mesh in meshes:
        refused = await spend(mesh, key)
        assert refused.status == 429 and refused.body["error_code"] == "BUDGET_EXHAUSTED", refused.body
        assert refused.body.get("reset_at"), refused.body


async def _spent_past(http, mesh, client_id: str, spent: str, limit: float) -> float | None:
    reported = (await account(http, mesh, client_id))[spent]
    return reported if reported >= limit else None
