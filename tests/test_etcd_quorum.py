"""etcd members killed under load (issue 13, "Failures"): two registry nodes on a 3-member cluster, a
router following both, an SDK agent heartbeating and a caller calling it through the router, while
registrations keep arriving at both nodes. One member (a follower) down: registrations are acknowledged. Two down:
they answer 503 ``storage_unavailable`` (decision 33 keeps the one code) without hanging, /healthz says
so, and reads and routing go on from the last view. Quorum back: writes resume. No acknowledged
registration is lost."""

from __future__ import annotations

import time

import aiohttp
from agent_reach import ReachClient, ReachError

from conftest import post, registration, wait_for
from failure_support import Failed, leader, routes, steady_load
from registry.server import RegistryServer
from router.server import RouterServer, RouterServerSettings

REFUSED = "503 storage_unavailable"


async def healthz_says(http: aiohttp.ClientSession, node: RegistryServer, status: int) -> None:
    async def says() -> bool:
        async with http.get(f"{node.url}/healthz") as response:
            return response.status == status
    await wait_for(says, timeout=20, what=f"{node.url}/healthz to say {status}")


async def serves_the_last_view(http: aiohttp.ClientSession, node: RegistryServer, agent_id: str) -> None:
    """``/query`` and ``/agents`` answer from memory, whatever etcd is doing."""
    status, found = await post(http, f"{node.url}/query", {"capability": "echo"})
    assert status == 200 and [i["agent_id"] for i in found["instances"]] == [agent_id], found
    async with http.get(f"{node.url}/agents") as response:
        assert response.status == 200, await response.text()
        assert agent_id in {agent["agent_id"] for agent in (await response.json())["agents"]}


async def test_quorum_lost_and_regained_under_load(etcd_cluster, etcd_registry, make_agent, teardown, http):
    cluster = await etcd_cluster()
    nodes = [await etcd_registry(cluster), await etcd_registry(cluster)]
    # Past this a refused write hangs: the store gives up after its timeout, a write waits for its watch
    # at most as long again.
    write_deadline = 2 * nodes[0].settings.etcd_timeout + 5
    router = RouterServer(RouterServerSettings(port=0, auth=False, registry_url=",".join(n.url for n in nodes)))
    await router.start()
    teardown.push_async_callback(router.stop)
    agent = make_agent("echo-1", [n.url for n in nodes])

    @agent.capability("echo")
    async def echo(payload, ctx):
        return payload

    await agent.start()
    await routes(http, router.url, "echo")

    acknowledged: list[str] = []

    async def register(n: int) -> str:
        """A new instance at each node in turn; the ids of those acknowledged are kept."""
        agent_id = f"filler-{n}"
        status, body = await post(http, f"{nodes[n % 2].url}/register",
                                  registration(agent_id, "filler", service="filler"))
        if status != 200:
            assert {"error", "message", "field"} <= set(body), body  # counted as "raised AssertionError"
            raise Failed(f"{status} {body['error']}", body["message"])
        acknowledged.append(agent_id)
        return "200"

    async with ReachClient(router.url) as client:
        async def call(n: int) -> str:
            try:
                await client.call("echo", {"n": n}, timeout=5)
            except ReachError as exc:
                raise Failed(exc.error_code, str(exc)) from exc
            return "ok"

        async with steady_load(call, rate=50, concurrency=8, deadline=10) as calls, \
                steady_load(register, rate=20, concurrency=4, deadline=write_deadline) as writes:
            await wait_for(lambda: writes.counts()["200"] >= 10, what=f"registrations with every member up ({writes})")

            # A follower, the one both nodes talk to first unless it leads: writes in flight when the leader
            # dies are test_etcd_leader_loss.py's.
            follower = min({0, 1, 2} - {await leader(cluster, http)})
            cluster.kill(follower)
            one_down = time.monotonic()
            await wait_for(lambda: writes.counts(started_after=one_down)["200"] >= 20, timeout=20,
                           what=f"registrations with one member down ({writes})")

            second = min({0, 1, 2} - {follower})
            cluster.kill(second)
            no_quorum = time.monotonic()
            await wait_for(lambda: writes.counts(started_after=no_quorum)[REFUSED] >= 4, timeout=30,
                           what=f"registrations refused without quorum ({writes})")
            for node in nodes:
                await healthz_says(http, node, 503)
                await serves_the_last_view(http, node, "echo-1")
            # Six seconds of calls: past the node lease (5 s) and the time a node takes to call its view stale.
            await wait_for(lambda: calls.counts(started_after=no_quorum)["ok"] >= 300, timeout=30,
                           what=f"calls routed without quorum ({calls})")

            cluster.start(follower)
            cluster.start(second)
            quorum_back = time.monotonic()
            await cluster.healthy(http)
            await wait_for(lambda: writes.counts(started_after=quorum_back)["200"] >= 10, timeout=30,
                           what=f"registrations to resume with quorum back ({writes})")

    report = f"calls: {calls}\nregistrations: {writes}"
    assert set(writes.counts(started_after=one_down, ended_before=no_quorum)) == {"200"}, report
    assert set(writes.counts(started_after=no_quorum, ended_before=quorum_back)) == {REFUSED}, report
    assert not [label for label in writes.counts() if label not in ("200", REFUSED)], report
    assert set(calls.counts()) == {"ok"}, report
    for node in nodes:
        await healthz_says(http, node, 200)
    for node in nodes:
        await wait_for(lambda: set(acknowledged) <= set(node.registry.state.records),  # noqa: B023
                       what=f"{node.url} to hold every acknowledged registration")
    # One node leads again (the sweep and evictions run somewhere), and the views are current.
    await wait_for(lambda: [node.membership.leads() for node in nodes].count(True) == 1, timeout=20,
                   what="one node to lead once quorum is back")
    assert all(node.membership.stale_seconds() is None for node in nodes)
    # The router follows again: it learns what was registered once quorum was back.
    await wait_for(lambda: set(acknowledged) <= set(router.mirror.instances), timeout=20,
                   what="the router to follow the registries again")
    fresh = await etcd_registry(cluster)
    lost = set(acknowledged) - set(fresh.registry.state.records)
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged registrations lost: {sorted(lost)}\n{report}"
    print(f"{len(acknowledged)} registrations acknowledged, none lost\n{report}")

