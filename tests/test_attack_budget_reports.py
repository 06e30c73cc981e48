"""Attacks on the router's spend reports: many budgeted clients spending at one router, whose reports (every
10 s, and the release at stop) go to the registry together. A real registry, router and metered agent on
127.0.0.1; the router's own lease asks are counted as they reach the registry."""

from __future__ import annotations

from router.budgets import REPORT_CONCURRENCY
from router.core import RouterSettings
from test_budgets_routers import metered, routers, spend  # noqa: F401 (a fixture)

CLIENTS = 40


async def test_reports_for_many_clients_go_a_few_at_a_time(start_mesh, metered):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1, routing=RouterSettings(budget_report_seconds=3600))
    keys = [(await mesh.new_client(["llm.*"], budget_tokens=1000, budget_period="day"))["api_key"]
            for _ in range(CLIENTS)]
    for key in keys:
        assert (await spend(mesh, key)).status == 200
    budgets = mesh.router.budgets
    asking = budgets.lease_budget
    assert asking is not None
    open_asks, most = 0, 0

    async def counted(client_id, request):
        nonlocal open_asks, most
        open_asks += 1
        most = max(most, open_asks)
        try:
            return await asking(client_id, request)
        finally:
            open_asks -= 1

    budgets.lease_budget = counted
    await budgets.report()
    await budgets.report(release=True)
    # Every client's spend reported and its lease given back, without one connection per client at once.
    assert budgets.asks["reported"] == CLIENTS and budgets.asks["released"] == CLIENTS
    assert most <= REPORT_CONCURRENCY, most
