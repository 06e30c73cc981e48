"""Attacks on a budget changed while routers hold leases of it: an operator lowers a client's budget below what a
router was granted under the old one. A real registry, router and metered agent on 127.0.0.1."""

from __future__ import annotations

from conftest import call, wait_for
from test_budgets_routers import metered, routers, spend  # noqa: F401 (a fixture)


async def test_a_lowered_budget_holds_though_a_router_holds_a_lease_granted_under_the_old_one(
        start_mesh, metered, http):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1)
    secrets = await mesh.new_client(["llm.*"], budget_tokens=10_000, budget_period="day")
    key, client_id = secrets["api_key"], secrets["client_id"]
    assert (await spend(mesh, key)).status == 200  # 10 tokens spent of a 500-token lease (5 %)

    status, body = await call(http, "PUT", f"{mesh.registry.url}/clients/{client_id}/budget", mesh.admin_key,
                              {"budget_tokens": 30, "budget_period": "day"})
    assert status == 200, body
    await wait_for(lambda: mesh.router.mirror.auth.clients[client_id].budget_tokens == 30, timeout=5,
                   what="the router to see the lowered budget")
    # 20 tokens are left of the new budget: two calls, then the client is refused, not 48 more from the old lease.
    statuses = [(await spend(mesh, key)).status for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429], statuses
