"""The etcd leader killed while registrations are on their way (issue 13, "Failures": one member of three
down and registrations are still acknowledged). etcd drops the proposals a follower forwarded to the
leader that died and answers them only at its own request timeout (seconds later, "request timed out,
possibly due to previous leader failure"); sent again once a new leader is elected (~0.5 s with the test
cluster's timers) they commit at once. A registration must not be refused for a loss the cluster has
already recovered from."""

from __future__ import annotations

import asyncio

from conftest import post, registration
from failure_support import leader


async def test_registrations_sent_as_the_etcd_leader_dies_are_acknowledged(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    node = await etcd_registry(cluster)
    assert (await post(http, f"{node.url}/register", registration("before", "x", service="x")))[0] == 200
    cluster.kill(await leader(cluster, http))
    answers = await asyncio.gather(*(post(http, f"{node.url}/register", registration(f"a{i}", "x", service="x"))
                                     for i in range(4)))
    assert [status for status, _ in answers] == [200] * 4, answers
