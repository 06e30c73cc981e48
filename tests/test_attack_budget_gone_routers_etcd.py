"""A killed router's lease given back in etcd mode: the router followed a node that does not lead, the leader knows
it only from that node's gossip, and only the leader gives back. Two registry nodes on a real 3-member etcd cluster,
a real `agentreach router` child process killed with SIGKILL, a router that stays live on the same node."""

from __future__ import annotations

from typing import Any

from conftest import call, wait_for
from registry.access import read_admin_key
from test_budgets_routers import CALL_TOKENS, metered, spend  # noqa: F401 (a fixture)


async def test_the_leader_gives_back_the_lease_of_a_router_killed_at_another_node_and_keeps_the_live_ones(
        etcd_cluster, etcd_registry, start_mesh, router_process, metered, http):  # noqa: F811 (the fixture imported)
    cluster = await etcd_cluster()
    nodes = [await etcd_registry(cluster, auth=True), await etcd_registry(cluster, auth=True)]
    await wait_for(lambda: sum(node.membership.leads() for node in nodes) == 1, timeout=10, what="a leader")
    [follower] = [node for node in nodes if not node.membership.leads()]
    for node in nodes:
        node.registry.budgets.router_gone_seconds = 0.3
    live = await start_mesh(follow="http", auth=True, registry=follower)
    await live.add(await metered("llm-1"), "llm.chat")
    secrets = await live.new_client(["llm.*"], budget_tokens=1000, budget_period="day")
    key, client_id = secrets["api_key"], secrets["client_id"]
    admin = read_admin_key(follower.settings.data_dir)
    doomed = await router_process(follower.url, "--auth", "on", "--admin-key", admin)

    async def spent_through_doomed() -> bool:
        async with http.post(f"{doomed.url}/atp", json={"capability": "llm.chat", "payload": CALL_TOKENS},
                             headers={"X-API-Key": key}) as response:
            return response.status == 200
    await wait_for(spent_through_doomed, timeout=15, what="the child router to spend from the client's budget")
    assert (await spend(live, key)).status == 200

    async def routers() -> dict[str, Any]:
        status, account = await call(http, "GET", f"{follower.url}/budgets/{client_id}", admin)
        assert status == 200, account
        return dict(account["routers"])
    live_id = live.router.mirror.router_id
    [doomed_id] = set(await routers()) - {live_id}
    doomed.kill()

    async def given_back() -> bool:
        return bool((await routers())[doomed_id].get("granted_tokens", 0) == 0)
    await wait_for(given_back, timeout=15, what="the leader to give back the killed router's 50 tokens")
    assert (await routers())[live_id]["granted_tokens"] == 50  # the live router, known by gossip, keeps its lease
