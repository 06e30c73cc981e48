"""`GET /cluster` on the embedded store: one node, leading, current; operators only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from conftest import admin_key, call, post, registration
from registry.server import RegistryServer


async def test_embedded_registry_is_one_leading_node(start_registry: Callable[..., Awaitable[RegistryServer]],
                                                     http: aiohttp.ClientSession) -> None:
    server = await start_registry(auth=True)
    key = admin_key(server)
    status, _ = await call(http, "GET", f"{server.url}/cluster")
    assert status == 401
    status, view = await call(http, "GET", f"{server.url}/cluster", key)
    assert status == 200
    assert view["store"] == "wal" and view["leader"] == view["node_id"] and view["stale_seconds"] is None
    assert [(node["node_id"], node["url"], node["leader"], node["this_node"]) for node in view["nodes"]] == [
        (view["node_id"], server.url, True, True)]
    assert view["etcd"] == [] and view["instances"] == 0


async def test_instances_count_live_records(start_registry: Callable[..., Awaitable[RegistryServer]],
                                            http: aiohttp.ClientSession) -> None:
    server = await start_registry()
    for name in ("a1", "a2"):
        status, _ = await post(http, f"{server.url}/register", registration(name, "cap.x", service="svc"))
        assert status == 200
    status, view = await call(http, "GET", f"{server.url}/cluster")
    assert status == 200 and view["instances"] == 2


async def test_routers_are_listed_under_the_node_whose_feed_they_follow(
        start_registry: Callable[..., Awaitable[RegistryServer]], http: aiohttp.ClientSession) -> None:
    server = await start_registry()
    assert server.hub is not None
    following = [server.hub.subscribe(None, router_id) for router_id in ("r-1", "r-2")]
    status, view = await call(http, "GET", f"{server.url}/cluster")
    assert status == 200
    assert view["routers"] == [{"router_id": "r-1", "node_id": view["node_id"], "share": 0.5},
                               {"router_id": "r-2", "node_id": view["node_id"], "share": 0.5}]
    for subscription in following:
        subscription.end()
