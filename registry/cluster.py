"""A registry node's place in its cluster: whether it leads (sweeps and evicts), how current its view is,
and what `GET /cluster` says. The embedded store's cluster is this node alone, always leading; etcd
mode's is in registry/etcd_cluster.py.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Protocol

from mesh.cluster import ClusterView, NodeView, RouterView
from registry.service import Registry
from registry.store import Fence
from registry.watch import WatchHub
from weblayer.errors import ApiError


def new_node_id() -> str:
    """Unique per process start: a restarted node is a new member (its soft state starts afresh)."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class Membership(Protocol):
    node_id: str

    def leads(self) -> bool:
        """Whether this node may run the health sweep and evict now."""
        ...

    def fence(self) -> Fence | None:
        """What an eviction must be written under, so that a node that lost the lead cannot evict."""
        ...

    def stale_seconds(self) -> float | None:
        """Seconds since this node's view was last known current; None while it is."""
        ...

    async def view(self) -> ClusterView: ...

    def hear(self, body: bytes, signature: str | None) -> None:
        """A message from another registry node (registry/gossip.py)."""
        ...


class SoleNode:
    """The embedded store (one process, its own log): the only node, so always the leader and current."""

    def __init__(self, registry: Registry, hub: WatchHub | None, url: str):
        self.node_id = hub.node_id if hub is not None else new_node_id()
        self.url = url
        self._registry = registry
        self._hub = hub
        self._started_at = time.time()

    def leads(self) -> bool:
        return True

    def fence(self) -> Fence | None:
        return None

    def stale_seconds(self) -> float | None:
        return None

    def hear(self, body: bytes, signature: str | None) -> None:
        raise ApiError(404, "not_found", "This registry is the only node: it has no peers to hear from")

    async def view(self) -> ClusterView:
        node = NodeView(node_id=self.node_id, url=self.url, started_at=self._started_at, leader=True, this_node=True)
        return ClusterView(store="wal", node_id=self.node_id, leader=self.node_id, nodes=[node],
                           routers=router_views(self._hub.routers() if self._hub is not None else {}),
                           instances=len(self._registry.state.keys.live))


def router_views(routers: dict[str, str]) -> list[RouterView]:
    """Every router (id -> the node whose feed it follows) with its share: an even split of every limit."""
    share = 1 / len(routers) if routers else 1.0
    return [RouterView(router_id=router_id, node_id=node_id, share=share)
            for router_id, node_id in sorted(routers.items())]
