"""A registry node cut off from etcd by SIGSTOP (issue 13, "Failures"): the members it talks to are frozen,
so its connections open and its requests are taken but never answered — a hung store, not a dead one.
It refuses writes with 503 ``storage_unavailable`` within a deadline (never hangs), /healthz says 503,
it stops leading (another node leads, on the members still answering) and says its view is stale while
reads go on; once the members are resumed it takes writes again and catches up. Cut off by closing its
connections instead: test_etcd_cluster.py."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from conftest import post, registration, wait_for
from failure_support import frozen
from registry.etcd_cluster import EtcdMembership
from registry.server import RegistryServer

# Short node leases and polls: a lost lead and a stale view show within seconds.
FAST = {"node_ttl": 2, "cluster_poll": 0.2, "gossip_interval": 0.2}
REFUSED = (503, "storage_unavailable")


def membership(node: RegistryServer) -> EtcdMembership:
    assert isinstance(node.membership, EtcdMembership)
    return node.membership


async def register(http: aiohttp.ClientSession, node: RegistryServer, agent_id: str) -> tuple[int, Any]:
    """A registration that must be answered, however etcd fails, before the store's timeout (twice: the
    write, then its watch) plus a margin: past it the registry hangs."""
    async with asyncio.timeout(2 * node.settings.etcd_timeout + 5):
        status, body = await post(http, f"{node.url}/register", registration(agent_id, "x", service="x"))
    return status, (body["error"] if status != 200 else body)


async def health(http: aiohttp.ClientSession, node: RegistryServer) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{node.url}/healthz") as response:
        return response.status, await response.json()


async def registers(http: aiohttp.ClientSession, node: RegistryServer, agent_id: str) -> None:
    async def acknowledged() -> bool:
        return (await register(http, node, agent_id))[0] == 200
    await wait_for(acknowledged, timeout=20, what=f"{node.url} to acknowledge {agent_id}")


async def test_a_node_whose_etcd_member_is_frozen_refuses_writes_stops_leading_and_recovers(
        etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    # The cut-off node talks to member 0 alone; the other to members 1 and 2, which keep quorum.
    cut_off = await etcd_registry(cluster, cluster.endpoints[:1], **FAST)
    await wait_for(lambda: membership(cut_off).leads(), what="the first node to lead")
    other = await etcd_registry(cluster, cluster.endpoints[1:], **FAST)
    assert (await register(http, cut_off, "before"))[0] == 200

    with frozen(cluster, 0):
        assert await register(http, cut_off, "refused") == REFUSED
        status, body = await health(http, cut_off)
        assert status == 503, body
        await wait_for(lambda: not membership(cut_off).leads(), timeout=10, what="the cut-off node to stop leading")
        await wait_for(lambda: membership(other).leads(), timeout=15, what="the other node to lead")
        await registers(http, other, "during")
        await wait_for(lambda: membership(cut_off).stale_seconds() is not None, timeout=10,
                       what="the cut-off node to know its view is stale")
        async with http.get(f"{cut_off.url}/agents") as response:
            assert response.status == 200 and float(response.headers["X-AgentReach-View-Stale"]) > 0
            assert "during" not in {agent["agent_id"] for agent in (await response.json())["agents"]}

    await registers(http, cut_off, "after")
    await wait_for(lambda: {"before", "during", "after"} <= set(cut_off.registry.state.records),
                   what="the cut-off node to catch up with what was written without it")
    await wait_for(lambda: membership(cut_off).stale_seconds() is None, timeout=15, what="current again")


async def test_every_member_frozen_refuses_writes_then_takes_them_again(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    node = await etcd_registry(cluster, **FAST)
    assert (await register(http, node, "before"))[0] == 200

    with frozen(cluster, 0, 1, 2):
        assert await register(http, node, "refused") == REFUSED
        status, body = await health(http, node)
        assert status == 503, body
        async with http.get(f"{node.url}/agents") as response:
            assert response.status == 200 and "before" in {a["agent_id"] for a in (await response.json())["agents"]}

    await registers(http, node, "after")
    await wait_for(lambda: membership(node).leads(), timeout=15, what="the node to lead again")

    async def healthy() -> bool:
        return (await health(http, node))[0] == 200
    await wait_for(healthy, timeout=15, what="/healthz 200 again")
