"""Attacks on budgets through routers that die: a router killed outright (kill -9, as a crash-looping worker is)
never gives back its lease, and its id never comes back (a new id per process). A real registry over HTTP, a real
`agentreach router` child process killed with SIGKILL, a metered agent on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import aiohttp

from conftest import call, wait_for
from router_support import Mesh
from test_budgets_routers import CALL_TOKENS, metered, routers, spend  # noqa: F401 (a fixture)


async def budget_account(http: aiohttp.ClientSession, mesh: Mesh, client_id: str) -> dict[str, Any]:
    status, account = await call(http, "GET", f"{mesh.registry.url}/budgets/{client_id}", mesh.admin_key)
    assert status == 200, account
    return dict(account)


async def test_a_killed_routers_unspent_lease_goes_back_to_the_account_once_it_is_gone_past_the_ttl(
        start_mesh, metered, router_process, http):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1)
    mesh.registry.registry.budgets.router_gone_seconds = 0.3
    secrets = await mesh.new_client(["llm.*"], budget_tokens=1000, budget_period="day")
    key, client_id = secrets["api_key"], secrets["client_id"]
    doomed = await router_process(mesh.registry.url, "--auth", "on", "--admin-key", mesh.admin_key)

    async def spent_through_doomed() -> bool:
        async with http.post(f"{doomed.url}/atp", json={"capability": "llm.chat", "payload": CALL_TOKENS},
                             headers={"X-API-Key": key}) as response:
            return response.status == 200
    await wait_for(spent_through_doomed, timeout=15, what="the child router to spend from the client's budget")

    async def account() -> dict[str, Any]:
        return await budget_account(http, mesh, client_id)
    [doomed_id] = (await account())["routers"]
    held = (await account())["routers"][doomed_id]
    # A 5 % chunk; its one call's spend is killed with it (reported with the next ask, or within 10 s).
    assert (held.get("granted_tokens"), held.get("spent_tokens", 0)) == (50, 0), held

    doomed.kill()

    async def given_back() -> bool:
        share = (await account())["routers"][doomed_id]
        return bool(share.get("granted_tokens", 0) == share.get("spent_tokens", 0) == 0)
    await wait_for(given_back, timeout=10, what="the killed router's 50 unspent tokens to go back to the account")
    # The live router spends the whole budget: 100 calls, not the 95 the stranded chunk left.
    statuses = [(await spend(mesh, key)).status for _ in range(101)]
    assert statuses == [200] * 100 + [429], statuses.count(200)


async def test_a_live_router_keeps_its_lease(start_mesh, metered, http):  # noqa: F811 (the fixture imported)
    [mesh] = await routers(start_mesh, metered, count=1)
    budgets = mesh.registry.registry.budgets
    budgets.router_gone_seconds = 0.0
    secrets = await mesh.new_client(["llm.*"], budget_tokens=1000, budget_period="day")
    assert (await spend(mesh, secrets["api_key"])).status == 200
    await budgets.reclaim(mesh.registry.hub.routers())
    await budgets.reclaim(mesh.registry.hub.routers())
    [share] = (await budget_account(http, mesh, secrets["client_id"]))["routers"].values()
    assert share["granted_tokens"] == 50, share
