"""Limits that hold across routers (issue 13 point 4): each router announces itself on the registry's
watch feed and enforces its share (1 / live routers) of every client rate and instance max_qps.

Real registries and routers on 127.0.0.1: one router follows the registry in process (as in
`agentreach up`), the other over `GET /watch` (as `agentreach router --registry URL`).

The load tests bound what the mesh admits by what a single bucket of the whole limit could: at most
``rate * window + burst``, where the window runs from before the first call was sent to after the
last answer came back (every router stamps its calls inside it, on the same monotonic clock). Before
the share, both routers admitted the whole limit each: with rate 4, the first 200 calls alternating
between them in 0.04 s had 8 admitted against a bound of 4.2, and over these tests' 1.5 s, 18 against
10 (run against the old code). The lower bound (the routers' starting bursts) holds whatever
the machine's speed, so a router refusing everything fails the test too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from conftest import post, registration, wait_for
from mesh.watch import Ping, Put, Reset, Routers, States, decode_event, encode_event
from registry.watch import WatchHub
from router.mirror import RegistryMirror
from router.ratelimit import TokenBucket
from router_support import Answer, Mesh, StartMesh, run_load

RATE = 4  # calls per second, mesh-wide: each of two routers admits 2/s from a burst of 2
LOAD_SECONDS = 1.5


async def two_routers(start_mesh: StartMesh, **options: Any) -> tuple[Mesh, Mesh]:
    """A router in process and one over HTTP, on one registry, each knowing of the other."""
    first = await start_mesh(**options)
    second = await start_mesh(follow="http", registry=first.registry, **options)
    await both_see(first, second, routers=2)
    return first, second


async def both_see(*meshes: Mesh, routers: int) -> None:
    def shared() -> bool:
        return all(len(mesh.router.mirror.routers) == routers for mesh in meshes)
    await wait_for(shared, timeout=10, what=f"every router to count {routers} live routers")


async def load(meshes: list[Mesh], call: Callable[[Mesh], Awaitable[Answer]]) -> tuple[int, float]:
    """Calls alternating between the routers for a while: (calls admitted, the window's seconds)."""
    turns = itertools.cycle(meshes)
    began = time.monotonic()
    answers = await run_load(lambda: call(next(turns)), until=lambda: time.monotonic() - began >= LOAD_SECONDS,
                             concurrency=2)
    window = time.monotonic() - began
    statuses = {answer.status for _, answer in answers}
    assert statuses <= {200, 429}, statuses
    return sum(answer.status == 200 for _, answer in answers), window


async def test_two_routers_admit_a_clients_rate_once_between_them(start_mesh: StartMesh, start_agent):
    first, second = await two_routers(start_mesh, auth=True)
    agent = await start_agent("echo-1")
    await first.add(agent, "echo")
    await wait_for(lambda: "echo-1" in second.router.mirror.states, what="the second router to see echo-1")
    client = await first.new_client(["echo"], rate_limit_qps=RATE)
    await wait_for(lambda: second.router.mirror.auth.client_by_api_key(client["api_key"]) is not None,
                   what="the second router to learn the client")
    headers = {"X-API-Key": client["api_key"]}
    admitted, window = await load([first, second], lambda mesh: mesh.call("echo", headers=headers))
    assert RATE <= admitted <= RATE * window + RATE, (admitted, window)
    assert agent.calls == admitted

    async def refused() -> Answer | None:
        answer = await first.call("echo", headers=headers)
        return answer if answer.status == 429 else None
    answer = await wait_for(refused, what="a call over the client's rate")
    assert "over its 4 calls/s (2 routers share it: this one admits 2/s)" in answer.body["error_message"]


async def test_two_routers_send_an_instance_its_max_qps_once_between_them(start_mesh: StartMesh, start_agent):
    first, second = await two_routers(start_mesh)
    agent = await start_agent("capped")
    await first.add(agent, "echo", metadata={"max_qps": RATE})
    await wait_for(lambda: "capped" in second.router.mirror.states, what="the second router to see the instance")
    admitted, window = await load([first, second], lambda mesh: mesh.call("echo"))
    assert RATE <= admitted <= RATE * window + RATE, (admitted, window)
    assert agent.calls == admitted
    # Each router's bucket is half the instance's: rate 2, burst 2.
    assert {mesh.router.book.bucket("capped", RATE).rate for mesh in (first, second)} == {RATE / 2}


async def router_status(mesh: Mesh) -> tuple[dict[str, Any], dict[str, float]]:
    """GET /healthz, and the share gauges of GET /metrics."""
    health = await mesh.get("/healthz")
    gauges = {}
    for line in (await mesh.get("/metrics")).splitlines():
        name, _, value = line.partition(" ")
        if name in ("agentreach_router_limit_share", "agentreach_router_peers"):
            gauges[name] = float(value)
    return health, gauges


async def test_a_router_that_stops_gives_its_share_back_and_the_shares_are_shown(start_mesh: StartMesh):
    first, second = await two_routers(start_mesh)
    hub = first.registry.hub
    assert hub is not None
    ids = {first.router.mirror.router_id, second.router.mirror.router_id}
    assert hub.local_routers() == ids and hub.routers() == dict.fromkeys(ids, hub.node_id)
    health, gauges = await router_status(second)
    assert health["router_id"] == second.router.mirror.router_id
    assert (health["routers"], health["limit_share"]) == (2, 0.5)
    assert gauges == {"agentreach_router_limit_share": 0.5, "agentreach_router_peers": 2}
    # The router over HTTP stops: the registry sees its stream end, and the other gets the whole limit.
    await second.router_server.stop()
    await wait_for(lambda: first.router.mirror.limit_share == 1.0, timeout=15,
                   what="the remaining router's share to return to 1")
    assert hub.local_routers() == {first.router.mirror.router_id}
    assert (await router_status(first))[1] == {"agentreach_router_limit_share": 1.0, "agentreach_router_peers": 1}
    # A new router joins; then the in-process one stops (its subscription ends with its task).
    third = await start_mesh(follow="http", registry=first.registry)
    await both_see(first, third, routers=2)
    await first.router_server.stop()
    await wait_for(lambda: third.router.mirror.limit_share == 1.0, timeout=15,
                   what="the new router's share to return to 1")
    assert hub.local_routers() == {third.router.mirror.router_id}


async def read_event(response) -> Any:
    """The next event of a watch stream that is not a ping."""
    while True:
        event = decode_event(await asyncio.wait_for(response.content.readline(), timeout=15))
        if not isinstance(event, Ping):
            return event


async def next_routers(response) -> list[str]:
    while not isinstance(event := await read_event(response), Routers):
        pass
    return event.routers


async def test_the_feed_announces_routers_to_routers_as_they_follow_and_leave(registry, http, agent):
    hub = registry.hub
    watch = f"{registry.url}/watch"
    async with http.get(watch, params={"router": "r-1"}) as first, http.get(watch) as plain:
        assert isinstance(await read_event(first), Reset) and isinstance(await read_event(plain), Reset)
        assert await read_event(first) == Routers(routers=["r-1"])
        async with http.get(watch, params={"router": "r-2"}) as second:
            assert isinstance(await read_event(second), Reset)
            assert await read_event(second) == await read_event(first) == Routers(routers=["r-1", "r-2"])
            # Routers following another registry node, as the node-to-node channel reports them.
            hub.set_peer_routers("node-2", frozenset({"r-9", "r-1"}))
            assert hub.routers() == {"r-1": hub.node_id, "r-2": hub.node_id, "r-9": "node-2"}
            assert await next_routers(first) == ["r-1", "r-2", "r-9"]
            hub.set_peer_routers("node-2", frozenset({"r-9", "r-1"}))  # no change: nothing published
            hub.forget_peer("node-2")
            assert await next_routers(first) == ["r-1", "r-2"]
            await second.release()
            assert await next_routers(first) == ["r-1"]
        assert hub.local_routers() == {"r-1"}
        # A follower that names no router (an older router, say) reads the feed as before: no Routers.
        await post(http, f"{registry.url}/register", registration("a1", "shared.echo", base_url=agent.url))
        assert isinstance(await read_event(plain), Put) and isinstance(await read_event(first), Put)


async def test_a_router_id_must_be_visible_ascii_and_at_most_128(registry, http):
    for bad in ("", "has space", "caf\u00e9", "tab\there", "x" * 129):
        async with http.get(f"{registry.url}/watch", params={"router": bad}) as response:
            body = await response.json()
            assert response.status == 400, bad
            assert (body["error"], body["field"]) == ("invalid_field", "router") and body["message"]
    assert registry.hub.routers() == {}
    longest = "x" * 128
    async with http.get(f"{registry.url}/watch", params={"router": longest}) as response:
        assert response.status == 200
        assert await next_routers(response) == [longest]


def test_the_routers_event_keeps_its_line_both_ways():
    event = Routers(routers=["host-1-a1b2c3", "host-2-d4e5f6"])
    line = b'{"type":"routers","routers":["host-1-a1b2c3","host-2-d4e5f6"]}\n'
    assert encode_event(event) == line
    assert decode_event(line[:-1]) == event
    assert json.loads(line) == msgspec.to_builtins(event) | {"type": "routers"}


def test_a_router_always_counts_itself_and_keeps_the_routers_through_a_reset():
    mirror = RegistryMirror("me")
    assert (mirror.routers, mirror.limit_share) == ({"me"}, 1.0)
    mirror.apply(Routers(routers=["a", "b", "c"]))  # not yet told of itself: still one of four
    assert (mirror.routers, mirror.limit_share) == ({"a", "b", "c", "me"}, 0.25)
    mirror.apply(Routers(routers=[]))
    assert mirror.limit_share == 1.0


def test_a_share_moving_back_and_forth_gives_no_extra_burst():
    bucket = TokenBucket(4)
    assert all(bucket.try_take(0.0) for _ in range(4)) and not bucket.try_take(0.0)
    bucket.retune(2)
    bucket.retune(4)
    assert bucket.burst == 4 and not bucket.try_take(0.0)
    # Full again after a while, then halved: the burst is cut, not kept.
    assert bucket.available(10.0) == 4
    bucket.retune(0.5)
    assert (bucket.burst, bucket.available(10.0)) == (1.0, 1.0)


async def test_a_router_dropped_for_being_slow_leaves_the_live_routers(registry):
    hub = WatchHub(registry.registry, queue_limit=3)
    hub.subscribe(router_id="slow")  # a reset and the routers event: room for one more
    assert hub.routers() == {"slow": "local"}
    for peer in range(3):  # each a new routers event for "slow", which reads none of them
        hub.set_peer_routers("node-2", frozenset({f"peer-{peer}"}))
    assert hub.local_routers() == frozenset() and hub.routers() == {"peer-2": "node-2"}
    hub.close()


async def test_a_follower_dropped_for_being_slow_reads_no_change_past_one_it_missed(registry, http, agent):
    """The follower resumes from the last revision it applied: had the hub dropped the oldest queued
    change and sent it the newer ones, that change would be lost to it for good."""
    hub = WatchHub(registry.registry, queue_limit=3)
    since = registry.store.revision
    stream = aiter(hub.subscribe(since, router_id="slow"))
    assert isinstance(await anext(stream), States) and await anext(stream) == Routers(routers=["slow"])
    for n in range(4):  # three fill its queue, the fourth ends the stream
        await post(http, f"{registry.url}/register", registration(f"s{n}", f"slow.n{n}", base_url=agent.url))
    revisions = [event.revision async for event in stream if isinstance(event, Put)]
    assert revisions == list(range(since + 1, since + 1 + len(revisions)))
    # Resuming from there (from the registry's own hub, whose queue holds more), it is sent every change
    # it has not seen.
    async for event in registry.hub.subscribe(since + len(revisions)):
        if isinstance(event, States):
            break
        assert isinstance(event, Put)
        revisions.append(event.revision)
    assert revisions == list(range(since + 1, registry.store.revision + 1)) and len(revisions) >= 4
    hub.close()
