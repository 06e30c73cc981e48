"""The node-to-node channel as an adversary sees it: only messages signed with the cluster's key count,
late or replayed news never turns an instance's clock back, and a node never listed in etcd cannot
leave routers counted for ever. Real registry nodes on a real 3-member etcd."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
from agent_reach.registration import HeartbeatRequest

from conftest import post, registration, wait_for
from etcd_support import EtcdCluster
from registry.gossip import SIGNATURE_HEADER, Heard, Tidings, sign
from registry.server import RegistryServer

Start = Callable[..., Awaitable[RegistryServer]]
FAST = {"node_ttl": 2, "cluster_poll": 0.2, "gossip_interval": 0.2}


def key_of(server: RegistryServer) -> bytes:
    assert server.registry is not None
    return server.registry.access.node_key()


async def tell(http: aiohttp.ClientSession, server: RegistryServer, body: bytes,
               signature: str | None) -> tuple[int, dict[str, Any]]:
    headers = {SIGNATURE_HEADER: signature} if signature is not None else {}
    async with http.post(f"{server.url}/cluster/gossip", data=body, headers=headers) as response:
        return response.status, (await response.json() if response.status != 204 else {})


def tidings(**fields: Any) -> bytes:
    return msgspec.msgpack.encode(Tidings(**{"node_id": "ghost", "sent_at": time.time(), **fields}))


async def test_only_signed_recent_messages_are_heard(etcd_cluster: Callable[[], Awaitable[EtcdCluster]],
                                                     etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    node = await etcd_registry(await etcd_cluster(), **FAST)
    body = tidings(routers=["r-ghost"])
    assert (await tell(http, node, body, None))[0] == 401
    status, refused = await tell(http, node, body, sign(b"not the cluster's key", body))
    assert (status, refused["error"], refused["field"]) == (401, "unauthenticated", SIGNATURE_HEADER)
    old = tidings(sent_at=time.time() - 3600)
    status, refused = await tell(http, node, old, sign(key_of(node), old))
    assert (status, refused["field"]) == (400, "sent_at")
    garbage = b"\x93not a message"
    assert (await tell(http, node, garbage, sign(key_of(node), garbage)))[0] == 400
    assert node.hub is not None and "r-ghost" not in node.hub.routers()


async def test_a_node_never_listed_leaves_no_routers_behind(etcd_cluster: Callable[[], Awaitable[EtcdCluster]],
                                                            etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    node = await etcd_registry(await etcd_cluster(), **FAST)
    assert node.hub is not None
    body = tidings(routers=["r-ghost"])
    assert (await tell(http, node, body, sign(key_of(node), body)))[0] == 204
    assert "r-ghost" in node.hub.routers()
    await wait_for(lambda: "r-ghost" not in node.hub.routers(), timeout=5, what="the ghost's routers forgotten")


async def test_old_news_never_turns_an_instance_clock_back(etcd_cluster: Callable[[], Awaitable[EtcdCluster]],
                                                           etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    node = await etcd_registry(await etcd_cluster(), **FAST)
    assert (await post(http, f"{node.url}/register", registration("a1", "x.one")))[0] == 200
    assert (await post(http, f"{node.url}/heartbeat", {"agent_id": "a1", "load": 0.2}))[0] == 200
    assert node.registry is not None
    seen = node.registry.state.liveness["a1"].last_seen
    stale = tidings(heard=[Heard(beat=HeartbeatRequest(agent_id="a1", load=0.9), at=time.time() - 30)])
    assert (await tell(http, node, stale, sign(key_of(node), stale)))[0] == 204
    liveness = node.registry.state.liveness["a1"]
    assert (liveness.last_seen, liveness.load) == (seen, 0.2)
    fresh = tidings(heard=[Heard(beat=HeartbeatRequest(agent_id="a1", load=0.9), at=time.time())])
    assert (await tell(http, node, fresh, sign(key_of(node), fresh)))[0] == 204
    assert liveness.load == 0.9 and liveness.last_seen is not None and seen is not None and liveness.last_seen > seen
