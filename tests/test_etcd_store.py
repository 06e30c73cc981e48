"""Registries on a real 3-member etcd cluster: shared state, rebuilt on restart, quorum lost and regained."""

from __future__ import annotations

import aiohttp
import pytest

from conftest import post, registration, wait_for
from registry.etcd_store import EtcdStore
from registry.server import RegistryServer
from registry.store import Change
from storage_support import AGENTREACH, agentreach, start_logged
from wal import WalUnavailable


async def agent_ids(http: aiohttp.ClientSession, server: RegistryServer) -> set[str]:
    async with http.get(f"{server.url}/agents") as response:
        return {agent["agent_id"] for agent in (await response.json())["agents"]}


async def test_second_registry_sees_registrations_and_restart_rebuilds(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    first = await etcd_registry(cluster)
    assert (await post(http, f"{first.url}/register", registration("a1", "x.one")))[0] == 200
    second = await etcd_registry(cluster)
    assert await agent_ids(http, second) == {"a1"}  # built by the range read
    assert (await post(http, f"{first.url}/register", registration("a2", "x.two")))[0] == 200
    await wait_for(lambda: "a2" in second.registry.state.records, what="a2 reached through the watch")
    await first.stop()
    again = await etcd_registry(cluster)
    assert await agent_ids(http, again) == {"a1", "a2"}
    assert again.store.revision == second.store.revision


async def test_writes_need_quorum_and_nothing_acknowledged_is_lost(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    server = await etcd_registry(cluster)
    acknowledged = []
    cluster.kill(0)  # the registry's first endpoint: it moves on to the next
    await cluster.healthy(http)  # if it led, the other two have elected a new leader
    for agent_id in ("a1", "a2"):
        status, body = await post(http, f"{server.url}/register", registration(agent_id, f"x.{agent_id}"))
        assert status == 200, body
        acknowledged.append(agent_id)
    cluster.kill(1)
    status, body = await post(http, f"{server.url}/register", registration("lost", "x.lost"))
    assert status == 503 and body["error"] == "storage_unavailable"
    async with http.get(f"{server.url}/healthz") as response:
        assert response.status == 503 and (await response.json())["error"] == "storage_unavailable"
    cluster.start(0)
    cluster.start(1)
    await cluster.healthy(http)

    async def healthz_ok() -> bool:
        async with http.get(f"{server.url}/healthz") as response:
            return response.status == 200
    await wait_for(healthz_ok, timeout=20, what="healthz ok with quorum back, no write needed")

    async def registers() -> bool:
        status, _ = await post(http, f"{server.url}/register", registration("a3", "x.a3"))
        return status == 200
    await wait_for(registers, timeout=20, what="writes resumed with quorum back")
    acknowledged.append("a3")
    fresh = await etcd_registry(cluster)
    assert set(acknowledged) <= await agent_ids(http, fresh)
    assert set(acknowledged) <= set(server.registry.state.records)


async def test_the_command_runs_a_registry_on_etcd(etcd_cluster, etcd_registry, http, tmp_path, monkeypatch):
    cluster = await etcd_cluster()
    monkeypatch.setenv("AGENTREACH_ETCD_ENDPOINTS", ",".join(cluster.endpoints))
    running = start_logged([*AGENTREACH, "registry", "--store", "etcd", "--etcd-prefix", f"/{tmp_path.name}/",
                            "--auth", "off", "--port", "0", "--data-dir", str(tmp_path / "data")],
                           ready="registry listening")
    try:
        status, body = await post(http, f"{running.url}/register", registration("a1", "x.one"))
        assert status == 200, body
        beside = await etcd_registry(cluster)
        assert "a1" in beside.registry.state.records
    finally:
        running.process.terminate()
        running.process.wait()


def test_etcd_without_endpoints_is_a_usage_error(tmp_path):
    result = agentreach("registry", "--store", "etcd", "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "--etcd-endpoints" in result.stderr


async def test_a_watch_cut_past_a_compaction_reads_afresh(etcd_cluster, relay, http, tmp_path, caplog):
    cluster = await etcd_cluster()
    member = await relay(cluster.client_ports[0])
    prefix = f"/{tmp_path.name}/"
    writer, follower = EtcdStore(cluster.endpoints[1:], prefix), EtcdStore([member.url], prefix, retry_delay=0.05)
    await writer.open()
    try:
        await writer.put("kept", b"1")
        await writer.put("gone", b"1")
        await follower.open()
        heard: list[Change] = []
        follower.watch(heard.append)
        await member.cut()
        await writer.delete("gone")
        await writer.put("new", b"2")
        await writer.put("kept", b"3")
        async with http.post(cluster.endpoints[1] + "/v3/kv/compaction",
                             json={"revision": writer.revision, "physical": True}) as response:
            assert response.status == 200

        async def compacted_on_the_followers_member() -> bool:
            async with http.post(cluster.endpoints[0] + "/v3/kv/range",
                                 json={"key": "eA==", "revision": follower.revision}) as response:
                return response.status != 200
        await wait_for(compacted_on_the_followers_member, what="member 0 to apply the compaction")
        await member.restore()
        await wait_for(lambda: follower.snapshot() == writer.snapshot(), what="the follower to read afresh")
        assert sorted((change.key, change.value) for change in heard) == [("gone", None), ("kept", b"3"),
                                                                          ("new", b"2")]
        assert "compacted past our revision" in caplog.text
        assert follower.revision == writer.revision
    finally:
        await follower.close()
        await writer.close()


async def test_a_watch_message_larger_than_a_stream_line_is_applied(etcd_cluster, tmp_path):
    """etcd's gateway sends each watch message as one JSON line, events batched and values in base64:
    a 600 KiB value makes a line far past aiohttp's default line limit (128 KiB), which must not stop
    the watch (a write is acknowledged only once the watch applied it)."""
    cluster = await etcd_cluster()
    store = EtcdStore(cluster.endpoints, f"/{tmp_path.name}/")
    await store.open()
    try:
        big = bytes(range(256)) * 2400
        await store.put("big", big)
        await store.put("after", b"1")
        assert store.snapshot() == {"big": big, "after": b"1"}
    finally:
        await store.close()


async def test_a_write_after_the_store_closed_is_an_outage_not_a_crash(etcd_cluster, tmp_path):
    """A handler still running while its registry stops used to raise RuntimeError("Session is closed"): a 500."""
    cluster = await etcd_cluster()
    store = EtcdStore(cluster.endpoints, f"/{tmp_path.name}/", timeout=2.0)
    await store.open()
    await store.close()
    with pytest.raises(WalUnavailable, match="stopping"):
        await store.put("instances/late", b"x")
