"""Registry nodes killed under load (issue 13's failures): real 3-member etcd, registry nodes and a router
as real processes, an SDK agent and ~200 calls/s through the router while a node dies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from conftest import registration, wait_for
from etcd_support import EtcdCluster
from failure_support import ChildProcess, Failed, routes, steady_load
from node_support import StartNode, cluster_view, evictions
from sdk_support import refused_url

Etcd = Callable[[], Awaitable[EtcdCluster]]


async def states_at(http: aiohttp.ClientSession, node: ChildProcess, capability: str) -> list[str]:
    async with http.post(f"{node.url}/query", json={"capability": capability}) as response:
        assert response.status == 200, await response.text()
        return [instance["state"] for instance in (await response.json())["instances"]]


async def test_killing_the_node_an_agent_heartbeats_to_loses_no_call_and_never_demotes_it(
        etcd_cluster: Etcd, registry_node: StartNode, router_process: Callable[[str], Awaitable[ChildProcess]],
        make_agent: Callable[..., Any], http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    # A short silence timeout: without soft state shared between nodes, the second node would show the
    # agent (which heartbeats to the first) demoted two seconds after it registered.
    flags = ("--node-ttl", "2", "--silence-timeout", "2")
    first, second = await registry_node(cluster, *flags), await registry_node(cluster, *flags)
    interval = 0.5
    agent = make_agent("mover-1", [first.url, second.url], heartbeat_interval=interval, service="movers")

    @agent.capability("move.echo")
    async def echo(payload: Any, ctx: Any) -> Any:
        return payload

    await agent.start()
    router = await router_process(f"{first.url},{second.url}")
    await routes(http, router.url, "move.echo")
    assert agent.link is not None and agent.link.registries.current == first.url
    async def healthy_at_second() -> bool:
        return await states_at(http, second, "move.echo") == ["healthy"]
    await wait_for(healthy_at_second, what="the second node hears of the agent's heartbeats")
    seen_at_second: list[tuple[float, str]] = []

    async def watch_second() -> None:
        while True:
            seen_at_second.extend((time.monotonic(), state) for state in await states_at(http, second, "move.echo"))
            await asyncio.sleep(0.05)  # sampling the state, not waiting for one

    async def call(n: int) -> str:
        async with http.post(f"{router.url}/atp", json={"capability": "move.echo", "payload": n}) as response:
            body = await response.json()
            if response.status != 200:
                raise Failed(body.get("error", {}).get("code", str(response.status)), str(body))
            return "ok"

    watching = asyncio.create_task(watch_second())
    try:
        async with steady_load(call, rate=200, concurrency=32, deadline=5) as tally:
            await wait_for(lambda: len(tally.outcomes) >= 300, timeout=15, what="300 calls before the kill")
            first.kill()
            killed_at = time.monotonic()
            await wait_for(lambda: agent.link.registries.current == second.url, timeout=2 * interval + 1,
                           interval=0.01, what="the agent heartbeats to the other node")
            moved_after = time.monotonic() - killed_at
            calls_at_kill = len(tally.outcomes)
            await wait_for(lambda: len(tally.outcomes) >= calls_at_kill + 600, timeout=20,
                           what="600 more calls after the kill")
            await wait_for(lambda: time.monotonic() - killed_at > 3, timeout=10, interval=0.1,
                           what="past the silence timeout after the kill")
    finally:
        watching.cancel()
    counts = tally.counts()
    assert counts == {"ok": len(tally.outcomes)}, f"{tally} (agent moved after {moved_after:.2f}s)"
    unhealthy = [(round(at - killed_at, 2), state) for at, state in seen_at_second if state != "healthy"]
    assert not unhealthy, f"seen at the surviving node (seconds after the kill, state): {unhealthy}"
    assert moved_after <= 2 * interval + 1


async def test_killing_the_leader_elects_another_that_still_evicts_and_no_two_nodes_evict(
        etcd_cluster: Etcd, registry_node: StartNode, http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    ttl = 2
    flags = ("--node-ttl", str(ttl), "--silence-timeout", "1", "--health-interval", "0.3", "--evict-after", "2")
    nodes = [await registry_node(cluster, *flags), await registry_node(cluster, *flags)]

    async def leading() -> ChildProcess | None:
        for node in nodes:
            if node.running.process.poll() is None:
                view = await cluster_view(http, node)
                if view["leader"] == view["node_id"]:
                    return node
        return None

    async def evict_a_dead_agent(agent_id: str, at: ChildProcess) -> None:
        dead = refused_url()  # nothing listens: every health check fails
        async with http.post(f"{at.url}/register", json=registration(agent_id, "dead.cap", service="deadsvc",
                                                                      base_url=dead)) as response:
            assert response.status == 200
        await wait_for(lambda: any(e["agent_id"] == agent_id for node in nodes for e in evictions(node)),
                       timeout=20, what=f"{agent_id} evicted")

    old_leader = await wait_for(leading, timeout=10, what="a leader")
    follower = next(node for node in nodes if node is not old_leader)
    await evict_a_dead_agent("dead-1", follower)
    old_leader.kill()
    killed_at = time.monotonic()
    new_leader = await wait_for(leading, timeout=ttl + 3, interval=0.05, what="a new leader")
    took = time.monotonic() - killed_at
    assert new_leader is follower
    await evict_a_dead_agent("dead-2", new_leader)
    evicted = [(node, event) for node in nodes for event in evictions(node)]
    assert sorted(event["agent_id"] for _, event in evicted) == ["dead-1", "dead-2"], evicted
    terms = {event["term"]: node for node, event in evicted}
    assert None not in terms and len(terms) == 2, f"each leader evicts under its own term: {evicted}"
    assert terms[min(terms)] is old_leader and terms[max(terms)] is new_leader, f"new leader after {took:.2f}s"
