"""Stand-in registries answering `GET /cluster` with views the embedded registry never gives: three etcd-mode
nodes, an etcd member down, routers sharing the limits, a node cut off from etcd, nobody leading. What
`agentreach status` and the console's cluster panel show for them is tested against a real HTTP server;
the views are built from mesh/cluster.py's Structs, so they have the contract's shape.
"""

from __future__ import annotations

import time

import msgspec
from agent_reach.connections import error_body
from aiohttp import web

from mesh.cluster import ClusterView, EtcdEndpoint, NodeView, RouterView
from recording_support import Received, RecordingServer

NODES = ("reg-a", "reg-b", "reg-c")
DOWN_MEMBER = "http://127.0.0.1:2383"


def etcd_view(*, asked: str = "reg-a", leader: str | None = "reg-b", stale_seconds: float | None = None) -> ClusterView:
    """Three registry nodes on a 3-member etcd (the third member down), two routers at half of every limit."""
    now = time.time()
    nodes = [NodeView(node_id=node, url=f"http://127.0.0.{i + 11}:8081", started_at=now - 600, leader=node == leader,
                      this_node=node == asked, last_heard=None if node == asked else 0.4)
             for i, node in enumerate(NODES)]
    etcd = [EtcdEndpoint(url="http://127.0.0.1:2379", healthy=True, rtt_ms=1.25),
            EtcdEndpoint(url="http://127.0.0.1:2381", healthy=True, rtt_ms=2.5),
            EtcdEndpoint(url=DOWN_MEMBER, healthy=False, error="connection refused")]
    routers = [RouterView(router_id="router-1", node_id="reg-a", share=0.5),
               RouterView(router_id="router-2", node_id="reg-c", share=0.5)]
    return ClusterView(store="etcd", node_id=asked, leader=leader, stale_seconds=stale_seconds, nodes=nodes,
                       etcd=etcd, routers=routers, instances=42)


class ClusterStandIn(RecordingServer):
    """Answers /cluster with ``view``, or with ``status`` and the mesh's error envelope when it is no 200;
    any other path is a 404 (a console's poll of /agents finds this registry failing)."""

    def __init__(self, view: ClusterView | None = None, status: int = 200):
        self.view = view
        self.status = status
        super().__init__(self._cluster)

    async def _cluster(self, request: web.Request, received: Received) -> web.Response:
        if request.path != "/cluster":
            return web.json_response(error_body("not_found", "Only /cluster here"), status=404)
        if self.status != 200:
            return web.json_response(error_body("storage_unavailable", "etcd has no quorum"), status=self.status)
        return web.Response(body=msgspec.json.encode(self.view), content_type="application/json")


class Redirector(RecordingServer):
    """Answers every request with a 307 to the same path on ``target``: no registry redirects, and a client
    that followed would hand its admin key to whatever the redirect names."""

    def __init__(self, target: str):
        self.target = target
        super().__init__(self._redirect)

    async def _redirect(self, request: web.Request, received: Received) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{self.target}{request.path}")
