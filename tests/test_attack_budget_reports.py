"""Attacks on the router's spend reports: many budgeted clients spending at one router, whose reports (every
10 s, and the release at stop) go to the registry together. A real registry, router and metered agent on
127.0.0.1; the router's own lease asks are counted as they reach the registry."""

from __future__ import annotations

import asyncio

from conftest import call, wait_for
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


async def test_a_release_at_stop_is_sent_though_a_report_is_on_its_way(start_mesh, metered, http):  # noqa: F811
    [mesh] = await routers(start_mesh, metered, count=1, routing=RouterSettings(budget_report_seconds=3600))
    secrets = await mesh.new_client(["llm.*"], budget_tokens=1000, budget_period="day")
    assert (await spend(mesh, secrets["api_key"])).status == 200  # 10 tokens spent of a 50-token lease
    budgets = mesh.router.budgets
    asking = budgets.lease_budget
    assert asking is not None
    slow, held = asyncio.Event(), asyncio.Event()

    async def slow_first(client_id, request):
        if not held.is_set():  # a slow registry: the periodic report is still on its way when the router stops
            held.set()
            await slow.wait()
        return await asking(client_id, request)

    budgets.lease_budget = slow_first
    report = asyncio.create_task(budgets.report())
    await wait_for(held.is_set, timeout=5, what="the report to reach the registry")
    release = asyncio.create_task(budgets.report(release=True))
    asyncio.get_running_loop().call_soon(slow.set)  # after the release's first step: it finds the report on its way
    await asyncio.gather(report, release)

    assert budgets.asks["released"] == 1
    status, account = await call(http, "GET", f"{mesh.registry.url}/budgets/{secrets['client_id']}", mesh.admin_key)
    assert status == 200
    [share] = account["routers"].values()
    assert share["granted_tokens"] == share["spent_tokens"] == 10, share
