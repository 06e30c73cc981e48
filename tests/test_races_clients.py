"""Races between two updates of one client record (enable/disable, rotate, budget), sent at the same moment
over real HTTP: at one registry (WAL) and at two registry nodes on a real 3-member etcd, both updates hold
(each is a compare-and-set of the record, retried when the other wrote first)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from auth.secrets import digest
from conftest import admin_key, call, wait_for
from registry.access import read_admin_key
from registry.server import RegistryServer

ROUNDS = 10


async def admin(http: aiohttp.ClientSession, method: str, node: RegistryServer, path: str, key: str,
                body: Any = None) -> Any:
    status, answer = await call(http, method, f"{node.url}{path}", key, body)
    assert status in (200, 201), answer
    return answer


async def settled(http: aiohttp.ClientSession, nodes: list[RegistryServer], client_id: str,
                  key: str) -> dict[str, Any]:
    """The client as every node holds it, once they hold the same (and the same key digest)."""
    async def agreed() -> dict[str, Any] | None:
        views = [await admin(http, "GET", node, f"/clients/{client_id}", key) for node in nodes]
        digests = {node.registry.state.auth.clients[client_id].api_key_digest for node in nodes}
        return views[0] if all(view == views[0] for view in views) and len(digests) == 1 else None
    return await wait_for(agreed, timeout=5, what="the registry nodes to agree on the client")


async def race(http: aiohttp.ClientSession, nodes: list[RegistryServer], key: str) -> None:
    """Each round, at once: one node disables or enables the client, the other rotates its credentials, then
    sets its budget; every update must hold afterwards, at every node."""
    first, second = nodes[0], nodes[-1]
    client = await admin(http, "POST", first, "/clients", key,
                         {"name": "app", "trust_level": "internal", "grants": ["echo"]})
    client_id = client["client_id"]
    for n in range(ROUNDS):
        enabled = n % 2 == 1
        switch = admin(http, "POST", first, f"/clients/{client_id}/{'enable' if enabled else 'disable'}", key)
        rotated, _ = await asyncio.gather(admin(http, "POST", second, f"/clients/{client_id}/rotate", key), switch)
        view = await settled(http, nodes, client_id, key)
        assert view["enabled"] is enabled, (n, view)
        assert second.registry.state.auth.clients[client_id].api_key_digest == digest(rotated["api_key"]), n
        budget = {"budget_tokens": 1000 + n, "budget_period": "day"}
        await asyncio.gather(admin(http, "PUT", second, f"/clients/{client_id}/budget", key, budget),
                             admin(http, "POST", first, f"/clients/{client_id}/{'disable' if enabled else 'enable'}",
                                   key))
        view = await settled(http, nodes, client_id, key)
        assert (view["enabled"], view["budget_tokens"]) == (not enabled, 1000 + n), (n, view)


async def test_two_updates_of_one_client_at_one_registry_both_hold(start_registry, http):
    registry = await start_registry(auth=True)
    await race(http, [registry], admin_key(registry))


async def test_two_updates_of_one_client_at_two_etcd_nodes_both_hold(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    nodes = [await etcd_registry(cluster, auth=True), await etcd_registry(cluster, auth=True)]
    key = read_admin_key(nodes[0].settings.data_dir)
    assert key is not None
    await race(http, nodes, key)



async def test_a_client_created_at_one_etcd_node_is_updated_at_once_at_the_other(etcd_cluster, etcd_registry,
                                                                                 relay, http):
    """The second node reaches etcd over a slow link, so its watch runs behind: it has not heard of a client
    the first node just created, and looks in etcd before answering client_not_found (to a read or an update)."""
    cluster = await etcd_cluster()
    first = await etcd_registry(cluster, auth=True)
    slow = await relay(int(cluster.endpoints[0].rsplit(":", 1)[1]), lag=0.2)
    second = await etcd_registry(cluster, [slow.url], auth=True)
    key = read_admin_key(first.settings.data_dir)
    assert key is not None
    for n in range(3):
        client = await admin(http, "POST", first, "/clients", key,
                             {"name": f"app{n}", "trust_level": "internal", "grants": ["echo"]})
        if n % 2:
            disabled = await admin(http, "POST", second, f"/clients/{client['client_id']}/disable", key)
            assert disabled["enabled"] is False
        else:
            assert (await admin(http, "GET", second, f"/clients/{client['client_id']}", key))["name"] == f"app{n}"
