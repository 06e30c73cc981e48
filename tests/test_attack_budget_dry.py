"""Attacks on a router that found its client's account dry: budget another router gives back afterwards (it stopped,
or was gone past the registry's router-liveness TTL) must reach it, and a truly empty account must not be asked on
every call. Real registry, two real routers following it over HTTP, a metered agent on 127.0.0.1."""

from __future__ import annotations

from test_budgets_routers import budgeted, metered, routers, spend  # noqa: F401 (a fixture)


async def test_budget_another_router_gave_back_is_spent_by_a_router_that_found_the_account_dry(
        start_mesh, metered):  # noqa: F811 (the fixture imported)
    holder, spender = await routers(start_mesh, metered)
    spender.router.budgets.dry_recheck = 0.0
    key = await budgeted([holder, spender], budget_tokens=400, budget_period="day")
    assert (await spend(holder, key)).status == 200  # holds a 20-token chunk, 10 of it spent
    statuses = [(await spend(spender, key)).status for _ in range(39)]
    assert statuses == [200] * 38 + [429], statuses.count(200)  # the 380 the holder does not hold

    await holder.router.budgets.report(release=True)  # the holder stops: its 10 unspent tokens go back
    assert (await spend(spender, key)).status == 200


async def test_a_dry_account_is_asked_once_an_interval_not_on_every_call(
        start_mesh, metered):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1)
    key = await budgeted([mesh], budget_tokens=20, budget_period="day")
    statuses = [(await spend(mesh, key)).status for _ in range(8)]
    assert statuses == [200, 200] + [429] * 6, statuses
    # Two asks granted the whole budget (the second left the account dry); the six refusals asked nothing.
    assert mesh.router.budgets.asks == {"granted": 2}, mesh.router.budgets.asks
