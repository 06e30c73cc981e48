"""Registry nodes sharing one etcd: one leader, soft state shared without etcd writes, a fenced lead,
and a node cut off from etcd that says so. Real 3-member etcd, real registry nodes on loopback."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from auth.kek import SECRETS_KEY_FILE, SecretsKeyError
from conftest import admin_key, call, post, registration, wait_for
from etcd_support import EtcdCluster, Relay
from registry.etcd_cluster import EtcdMembership, cluster_prefix
from registry.etcd_http import Range, b64, decode
from registry.lifecycle import LifecycleConfig
from registry.server import RegistryServer, RegistrySettings
from registry.store import Fenced
from sdk_support import free_port

Start = Callable[..., Awaitable[RegistryServer]]
FAST = {"node_ttl": 2, "cluster_poll": 0.2, "gossip_interval": 0.2}


def membership(server: RegistryServer) -> EtcdMembership:
    assert isinstance(server.membership, EtcdMembership)
    return server.membership


async def cluster_view(http: aiohttp.ClientSession, server: RegistryServer) -> dict[str, Any]:
    async with http.get(f"{server.url}/cluster") as response:
        assert response.status == 200
        return dict(await response.json())


async def metrics(http: aiohttp.ClientSession, server: RegistryServer) -> dict[str, float]:
    """The unlabelled samples of a node's /metrics."""
    async with http.get(f"{server.url}/metrics") as response:
        text = await response.text()
    return {family.name if family.type != "counter" else family.name + "_total": sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples if not sample.labels}


async def etcd_revision(http: aiohttp.ClientSession, cluster: EtcdCluster) -> int:
    async with http.post(f"{cluster.endpoints[0]}/v3/kv/range", json={"key": b64("/"), "limit": 1}) as response:
        return decode(await response.read(), Range).header.revision


Etcd = Callable[[], Awaitable[EtcdCluster]]


async def test_one_leader_and_every_node_listed(etcd_cluster: Etcd, etcd_registry: Start,
                                               http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    first, second = await etcd_registry(cluster, **FAST), await etcd_registry(cluster, **FAST)

    async def agreed() -> bool:
        views = [await cluster_view(http, server) for server in (first, second)]
        return all(len(view["nodes"]) == 2 and view["leader"] is not None for view in views) and \
            views[0]["leader"] == views[1]["leader"]
    await wait_for(agreed, timeout=10, what="both nodes listed with one leader")
    view = await cluster_view(http, second)
    assert view["store"] == "etcd" and view["stale_seconds"] is None
    assert {node["url"] for node in view["nodes"]} == {first.url, second.url}
    assert [node["this_node"] for node in view["nodes"] if node["url"] == second.url] == [True]
    assert [endpoint["healthy"] for endpoint in view["etcd"]] == [True, True, True]
    assert sorted(membership(server).leads() for server in (first, second)) == [False, True]
    scraped = [await metrics(http, server) for server in (first, second)]
    assert sorted(sample["agentreach_registry_leader"] for sample in scraped) == [0, 1]
    assert [sample["agentreach_registry_nodes"] for sample in scraped] == [2, 2]
    assert all(sample["agentreach_etcd_rtt_seconds"] > 0 for sample in scraped)


async def test_a_heartbeat_at_one_node_keeps_the_instance_healthy_at_every_node(
        etcd_cluster: Callable[[], Awaitable[EtcdCluster]], etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    """Without the node-to-node channel the second node never hears the heartbeats: it would show the
    instance pending, then demoted once the silence timeout passes."""
    cluster = await etcd_cluster()
    lifecycle = LifecycleConfig(silence_timeout=1.0, health_interval=60)
    first = await etcd_registry(cluster, lifecycle=lifecycle, **FAST)
    second = await etcd_registry(cluster, lifecycle=lifecycle, **FAST)
    assert (await post(http, f"{first.url}/register", registration("a1", "x.one")))[0] == 200
    started = time.monotonic()

    async def heartbeating_past_the_silence_timeout() -> bool:
        assert (await post(http, f"{first.url}/heartbeat", {"agent_id": "a1", "load": 0.7}))[0] == 200
        return time.monotonic() - started > 2.5
    await wait_for(heartbeating_past_the_silence_timeout, timeout=15, interval=0.2, what="2.5 s of heartbeats")
    status, found = await post(http, f"{second.url}/query", {"capability": "x.one"})
    assert status == 200
    assert (found["instances"][0]["state"], found["instances"][0]["load"]) == ("healthy", 0.7)


async def test_heartbeats_write_nothing_to_etcd(etcd_cluster: Etcd, etcd_registry: Start,
                                                http: aiohttp.ClientSession) -> None:
    """etcd's write rate follows state changes only: a few hundred heartbeats at two nodes, no revision."""
    cluster = await etcd_cluster()
    first, second = await etcd_registry(cluster, **FAST), await etcd_registry(cluster, **FAST)
    for agent_id in ("a1", "a2"):
        assert (await post(http, f"{first.url}/register", registration(agent_id, "x.one", service="svc")))[0] == 200
    assert "agentreach_etcd_watch_lag_seconds" in await metrics(http, first)  # measured on its own writes
    await wait_for(lambda: membership(first).leads() or membership(second).leads(), what="a leader")
    before = await etcd_revision(http, cluster)
    for _ in range(100):
        for server in (first, second):
            for agent_id in ("a1", "a2"):
                assert (await post(http, f"{server.url}/heartbeat", {"agent_id": agent_id, "load": 0.3}))[0] == 200
    assert await etcd_revision(http, cluster) == before


async def test_a_node_that_lost_the_lead_cannot_evict(etcd_cluster: Callable[[], Awaitable[EtcdCluster]],
                                                      etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    first = await etcd_registry(cluster, **FAST)
    await wait_for(lambda: membership(first).leads(), what="the only node leads")
    stale_fence = membership(first).fence()
    assert stale_fence is not None
    assert (await post(http, f"{first.url}/register", registration("a1", "x.one")))[0] == 200
    # The lead ends as a lease that ran out would end it: the leader key goes, and another node takes it.
    async with http.post(f"{cluster.endpoints[0]}/v3/kv/deleterange", json={"key": b64(stale_fence.key)}) as response:
        assert response.status == 200
    second = await etcd_registry(cluster, **FAST)
    await wait_for(lambda: membership(second).leads() != membership(first).leads(), what="one leader again")
    winner = first if membership(first).leads() else second
    assert membership(winner).fence() != stale_fence
    assert first.registry is not None
    with pytest.raises(Fenced):
        await first.registry.evict("a1", "test: evicting under an old term", stale_fence)
    assert first.registry.agent("a1").state != "evicted"


async def test_a_node_cut_off_from_etcd_stops_leading_and_says_its_view_is_stale(
        etcd_cluster: Etcd, etcd_registry: Start, relay: Callable[[int], Awaitable[Relay]],
        http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    link = await relay(cluster.client_ports[0])
    cut_off = await etcd_registry(cluster, [link.url], **FAST)
    await wait_for(lambda: membership(cut_off).leads(), what="the only node leads")
    other = await etcd_registry(cluster, **FAST)
    following = await http.get(f"{cut_off.url}/watch")
    assert following.status == 200 and await following.content.readline()  # the reset
    await link.cut()
    await wait_for(lambda: not membership(cut_off).leads(), timeout=10, what="the cut-off node stops leading")
    await wait_for(lambda: membership(other).leads(), timeout=15, what="the other node leads once the lease ran out")

    async def stale_health() -> dict[str, Any] | None:
        async with http.get(f"{cut_off.url}/healthz") as response:
            body = await response.json()
            return dict(body) if response.status == 503 and body["error"] == "view_stale" else None
    health = await wait_for(stale_health, timeout=10, what="/healthz says the view is stale")
    assert health["stale_seconds"] > 0
    async with http.get(f"{cut_off.url}/agents") as response:
        assert response.status == 200 and float(response.headers["X-AgentReach-View-Stale"]) > 0
    async with http.get(f"{cut_off.url}/watch") as response:
        assert response.status == 503 and (await response.json())["error"] == "view_stale"
    async with http.get(f"{other.url}/agents") as response:
        assert response.status == 200 and "X-AgentReach-View-Stale" not in response.headers
    async def stream_ended() -> None:
        while line := await following.content.readline():
            assert line.strip()  # pings and states until the stream ends
    await asyncio.wait_for(stream_ended(), 10)  # the open watch stream ends, so its router moves
    following.release()
    await link.restore()
    await wait_for(lambda: membership(cut_off).stale_seconds() is None, timeout=15, what="current again")


async def test_a_node_with_another_secrets_key_refuses_to_start(etcd_cluster: Etcd, etcd_registry: Start,
                                                                tmp_path: Path) -> None:
    cluster = await etcd_cluster()
    await etcd_registry(cluster, **FAST)
    with pytest.raises(SecretsKeyError, match=r"secrets\.key differs"):
        await etcd_registry(cluster, data_dir=tmp_path / "elsewhere", **FAST)
    # Refused half way (after it began listening): nothing is left running behind the exception.
    port = free_port()
    refused = RegistryServer(RegistrySettings(data_dir=tmp_path / "elsewhere", port=port, auth=False, store="etcd",
                                              etcd_endpoints=cluster.endpoints, etcd_prefix=f"/{tmp_path.name}/",
                                              etcd_timeout=2.0, **FAST))
    with pytest.raises(SecretsKeyError):
        await refused.start()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_node_joining_without_admin_key_keeps_the_clusters(etcd_cluster: Etcd, etcd_registry: Start,
                                                                   tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Before, the joining node made a key of its own and replaced the cluster's: the first node's key
    stopped working everywhere."""
    cluster = await etcd_cluster()
    first = await etcd_registry(cluster, auth=True, **FAST)
    key = admin_key(first)
    joining_dir = tmp_path / "joining"
    joining_dir.mkdir(mode=0o700)
    shutil.copy2(tmp_path / "data" / SECRETS_KEY_FILE, joining_dir / SECRETS_KEY_FILE)
    second = await etcd_registry(cluster, auth=True, data_dir=joining_dir, **FAST)
    assert second.new_admin_key is None and not (joining_dir / "admin.key").exists()
    for server in (first, second):
        status, _ = await call(http, "GET", f"{server.url}/agents", key)
        assert status == 200


async def test_an_unreadable_node_entry_does_not_blind_the_others(etcd_cluster: Etcd, etcd_registry: Start,
                                                                  tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Before, the entry's decoding error ended every look: the node never listed itself nor led, and went stale."""
    cluster = await etcd_cluster()
    junk = cluster_prefix(f"/{tmp_path.name}/") + "nodes/junk"
    async with http.post(f"{cluster.endpoints[0]}/v3/kv/put", json={"key": b64(junk), "value": b64("{not json")}):
        pass
    node = await etcd_registry(cluster, **FAST)
    await wait_for(lambda: membership(node).leads(), timeout=10, what="the node leads")
    view = await cluster_view(http, node)
    assert [entry["url"] for entry in view["nodes"]] == [node.url] and view["leader"] == view["node_id"]
    await wait_for(lambda: membership(node).stale_seconds() is None, what="a current view")
