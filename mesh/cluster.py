"""What `GET /cluster` on a registry node says: the registry nodes, the leader, etcd's members and the
routers with their share of every limit. Read by `agentreach status` and the console's home page.

With the embedded store (`agentreach up`, the WAL) the cluster is one node that always leads.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class EtcdEndpoint(msgspec.Struct, kw_only=True):
    """One etcd member as this node sees it: ``rtt_ms`` of its last health probe, or why it failed."""

    url: str
    healthy: bool
    rtt_ms: float | None = None
    error: str | None = None


class NodeView(msgspec.Struct, kw_only=True):
    """A registry node alive in the cluster (its lease holds)."""

    node_id: str
    url: str
    started_at: float
    leader: bool
    # The node that answered this request.
    this_node: bool
    # Seconds since this node last heard from it over the node-to-node soft-state channel (None: itself,
    # or never yet).
    last_heard: float | None = None


class RouterView(msgspec.Struct, kw_only=True):
    """A router following some registry node's watch feed; it enforces ``share`` of every limit."""

    router_id: str
    node_id: str
    share: float


class ClusterView(msgspec.Struct, kw_only=True):
    store: Literal["wal", "etcd"]
    node_id: str
    # The leading node's id (runs health sweeps and evictions); None while nobody leads.
    leader: str | None
    # Seconds since this node's view was last known current (its etcd lease renewed); None when current.
    # A node cut off from etcd says so here, in `/healthz`, and in a header on every read.
    stale_seconds: float | None = None
    nodes: list[NodeView] = []
    etcd: list[EtcdEndpoint] = []
    routers: list[RouterView] = []
    instances: int = 0
