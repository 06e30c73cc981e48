"""One of the etcd members a registry node talks to hangs (SIGSTOP: it takes connections, answers nothing)
while the cluster keeps quorum and the node's other endpoint answers (issue 13, "Failures": a node cut off
from etcd). The node's endpoint list is there for this: its writes must resume through the live endpoint,
and its watch, silent on the frozen member, must move there too, so it sees what other nodes write."""

from __future__ import annotations

from conftest import post, registration, wait_for
from failure_support import frozen

# Short node leases and polls: a lost lead and a stale view show within seconds.
FAST = {"node_ttl": 2, "cluster_poll": 0.2, "gossip_interval": 0.2}


async def test_a_node_moves_past_a_frozen_member_to_its_live_endpoint(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    node = await etcd_registry(cluster, cluster.endpoints[:2], **FAST)  # member 0 first: its watch is there
    other = await etcd_registry(cluster, cluster.endpoints[1:], **FAST)
    assert (await post(http, f"{node.url}/register", registration("before", "x", service="x")))[0] == 200

    with frozen(cluster, 0):
        async def other_registers() -> bool:
            return (await post(http, f"{other.url}/register", registration("during", "x", service="x")))[0] == 200
        await wait_for(other_registers, timeout=20, what="the other node to register with member 0 frozen")

        async def node_registers() -> bool:
            return (await post(http, f"{node.url}/register", registration("also", "x", service="x")))[0] == 200
        await wait_for(node_registers, timeout=30, what="the node's writes to resume through member 1")
        await wait_for(lambda: "during" in node.registry.state.records, timeout=30,
                       what="the node's watch to move to member 1 and deliver the other node's write")
        assert node.membership.stale_seconds() is None
