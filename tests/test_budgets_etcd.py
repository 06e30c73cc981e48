"""Client budgets in etcd mode: two registry nodes on a real 3-member etcd cluster keep one account per
client, so leases asked of both at once never grant more than the budget, and two routers following
different nodes hold a daily budget under concurrent load to the documented bound."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import call, wait_for
from registry.access import read_admin_key
from test_budgets_routers import TOKENS_PER_CALL, WORKERS, budgeted, metered, tokens_used, until_refused  # noqa: F401
from test_usage_routing import MeteredAgent

ASKS = 25


async def test_asks_racing_at_two_nodes_never_grant_past_the_budget(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    nodes = [await etcd_registry(cluster, auth=True), await etcd_registry(cluster, auth=True)]
    key = read_admin_key(nodes[0].settings.data_dir)
    status, client = await call(http, "POST", f"{nodes[0].url}/clients", key,
                                {"name": "app", "trust_level": "internal", "grants": ["llm.*"],
                                 "budget_tokens": 1000, "budget_period": "day"})
    assert status == 201, client

    async def ask(node: Any, router: str) -> dict[str, Any]:
        status, grant = await call(http, "POST", f"{node.url}/budgets/{client['client_id']}/lease", key,
                                   {"router_id": router, "want_tokens": 30})
        assert status == 200, grant
        return dict(grant)

    grants = await asyncio.gather(*(ask(nodes[i % 2], f"r-{i % 4}") for i in range(ASKS * 2)))
    told: dict[str, int] = {}
    for i, grant in enumerate(grants):
        router = f"r-{i % 4}"
        told[router] = max(told.get(router, 0), grant["share"].get("granted_tokens", 0))

    async def account_at_other_node() -> dict[str, Any] | None:
        """The account as the other node holds it, once its watch caught up with what the routers were told."""
        status, account = await call(http, "GET", f"{nodes[1].url}/budgets/{client['client_id']}", key)
        assert status == 200
        shares = {router: share.get("granted_tokens", 0) for router, share in account["routers"].items()}
        return account if shares == told else None

    # 50 asks of at least 50 tokens each (a 5% chunk) would be 2,500 without one account; a lost update would
    # leave routers told more than the account holds. Exactly the budget is granted, and both nodes say so.
    account = await wait_for(account_at_other_node, timeout=5, what=f"the other node's account to hold {told}")
    assert sum(told.values()) == account["committed_tokens"] == 1000, (told, account)
    assert min(grant["left_tokens"] for grant in grants) == 0


async def test_two_routers_on_two_nodes_hold_a_daily_budget(etcd_cluster, etcd_registry, start_mesh,
                                                              metered):  # noqa: F811 (the fixture imported)
    cluster = await etcd_cluster()
    nodes = [await etcd_registry(cluster, auth=True), await etcd_registry(cluster, auth=True)]
    meshes = [await start_mesh(follow="http", auth=True, registry=node) for node in nodes]
    agent: MeteredAgent = await metered("llm-1")
    await meshes[0].add(agent, "llm.chat")
    await meshes[1].until_state("llm-1")
    key = await budgeted(meshes, budget_tokens=600, budget_period="day")
    answers = await until_refused(meshes, key)
    used = tokens_used(answers)
    assert 600 - 2 * TOKENS_PER_CALL <= used <= 600 + 2 * WORKERS * TOKENS_PER_CALL, used
    assert {a.body["error_code"] for kept in answers.values() for a in kept if a.status != 200} == {"BUDGET_EXHAUSTED"}
