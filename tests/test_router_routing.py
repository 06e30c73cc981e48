"""Selection end to end: each policy, capacity, state tiers and failover, with real agents and registry."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from agent_support import Agent
from conftest import wait_for
from router_support import Answer, Mesh, run_load


async def test_least_load_spreads_calls_by_inflight(mesh: Mesh, start_agent):
    agents = [await start_agent(f"ll-{i}") for i in range(3)]
    gate = asyncio.Event()
    for agent in agents:
        agent.gate = gate
    await mesh.add_all(agents)
    calls = [asyncio.create_task(mesh.call(payload=i)) for i in range(6)]
    await wait_for(lambda: sum(agent.inflight for agent in agents) == 6, what="six calls held by the agents")
    # Each call went where the router had the fewest calls in flight: two each, not six on one.
    assert [agent.inflight for agent in agents] == [2, 2, 2]
    gate.set()
    answers = await asyncio.gather(*calls)
    assert [answer.status for answer in answers] == [200] * 6
    assert Counter(answer.route["instance"] for answer in answers) == {"ll-0": 2, "ll-1": 2, "ll-2": 2}
    assert {answer.route["policy"] for answer in answers} == {"least_load"}


async def test_least_load_prefers_the_instance_reporting_less_load(mesh: Mesh, start_agent):
    busy, idle = await start_agent("loaded"), await start_agent("idle")
    await mesh.add_all([busy, idle])
    await mesh.heartbeat("loaded", load=0.9)
    await wait_for(lambda: mesh.router.mirror.states["loaded"].load == 0.9, what="the reported load")
    answers = [await mesh.call(payload=i) for i in range(10)]
    assert {answer.route["instance"] for answer in answers} == {"idle"}
    assert busy.calls == 0


async def test_max_qps_answers_busy_fast_and_never_queues(mesh: Mesh, start_agent):
    agents = [await start_agent(f"qps-{i}") for i in range(2)]
    await mesh.add_all(agents, metadata={"max_qps": 2})
    # Each bucket holds max(1, max_qps) = 2 tokens: four calls pass at once, the fifth finds none.
    answers = await asyncio.gather(*(mesh.call(payload=i) for i in range(4)))
    assert [answer.status for answer in answers] == [200] * 4
    busy = await mesh.call(payload="one too many")
    # A call that queued would be served once a token came back (one every 0.5 s): BUSY with no call
    # beyond the four shows it was answered at once, whatever the machine's load made "at once" take.
    assert busy.status == 429 and busy.body["error_code"] == "BUSY" and busy.body["can_retry"] is True
    assert [agent.calls for agent in agents] == [2, 2]
    # Tokens come back at max_qps per second: a caller that retries later gets through.
    later = await wait_for(lambda: mesh.router.book.bucket("qps-0", 2).available(time.monotonic()) >= 1,
                           what="a token to return")
    assert later
    assert (await mesh.call(payload="later")).status == 200


async def test_hash_keeps_sessions_and_membership_changes_move_about_one_nth(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"policy": "hash"})
    agents = [await start_agent(f"h-{i}") for i in range(5)]
    await mesh.add_all(agents[:4])
    sessions = [f"session-{i}" for i in range(200)]

    async def placement() -> dict[str, str]:
        answers = [await mesh.call(payload=s, context={"session_id": s}) for s in sessions]
        assert {answer.route["policy"] for answer in answers} == {"hash"}
        return {s: answer.route["instance"] for s, answer in zip(sessions, answers, strict=False)}

    first = await placement()
    assert await placement() == first, "a session must keep its instance"
    assert min(Counter(first.values()).values()) > 20, "the ring should spread sessions over all four"
    # Adding a fifth instance moves about 1/5 of sessions, and only onto the newcomer.
    await mesh.add(agents[4])
    grown = await placement()
    moved = [s for s in sessions if grown[s] != first[s]]
    assert {grown[s] for s in moved} == {"h-4"}
    assert 0.1 <= len(moved) / len(sessions) <= 0.32, len(moved)
    # Removing one of five moves exactly the sessions it held (about 1/5); the rest stay put.
    await mesh.deregister("h-1")
    await wait_for(lambda: "h-1" not in mesh.router.mirror.instances, what="the router to drop h-1")
    shrunk = await placement()
    moved = [s for s in sessions if shrunk[s] != grown[s]]
    assert set(moved) == {s for s in sessions if grown[s] == "h-1"}
    assert 0.1 <= len(moved) / len(sessions) <= 0.32, len(moved)


async def test_hash_by_instance_preference_when_the_capability_has_no_policy(mesh: Mesh, start_agent):
    await mesh.add_all([await start_agent(f"pref-{i}") for i in range(2)], metadata={"routing_policy": "hash"})
    answers = [await mesh.call(payload=i, context={"session_id": "same"}) for i in range(8)]
    assert {answer.route["policy"] for answer in answers} == {"hash"}
    assert len({answer.route["instance"] for answer in answers}) == 1


async def test_affinity_sends_only_to_matching_metadata_and_refuses_otherwise(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"policy": "affinity"})
    prod = await start_agent("prod-a")
    staging = await start_agent("staging-a")
    await mesh.add(prod, metadata={"env": "prod", "zone": "eu"}, healthy=False)
    await mesh.add(staging, metadata={"env": "staging", "zone": "eu"}, healthy=False)
    await mesh.ready("prod-a", "staging-a")
    for i in range(6):
        answer = await mesh.call(payload=i, context={"routing_hint": {"env": "staging", "zone": "eu"}})
        assert answer.status == 200 and answer.route["instance"] == "staging-a"
    assert (prod.calls, staging.calls) == (0, 6)
    refused = await mesh.call(payload="x", context={"routing_hint": {"env": "dev"}})
    assert refused.status == 503
    assert refused.body["error_code"] == "ROUTING_HINT_UNSATISFIABLE" and refused.body["can_retry"] is False
    assert "env='dev'" in refused.body["error_message"]
    # Staging down: a staging caller gets an error, never production.
    await staging.stop()
    for i in range(3):
        failed = await mesh.call(payload=i, context={"routing_hint": {"env": "staging"}})
        assert failed.status >= 500 and failed.route.get("instance") in (None, "staging-a")
    assert prod.calls == 0


async def test_sticky_sessions_return_to_the_same_instance(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"policy": "least_load",
                                   "affinity": {"enabled": True, "key": "user_id", "ttl_seconds": 60}})
    agents = [await start_agent(f"st-{i}") for i in range(3)]
    await mesh.add_all(agents)
    homes = {}
    for user in ("ann", "bob", "cy", "dee", "eve", "fay"):
        answers = [await mesh.call(payload=i, context={"user_id": user}) for i in range(5)]
        instances = {answer.route["instance"] for answer in answers}
        assert len(instances) == 1, f"{user} moved between {instances}"
        homes[user] = instances.pop()
    # Stickiness holds against least-load: a call in flight on ann's instance does not move her.
    home = next(agent for agent in agents if agent.name == homes["ann"])
    home.gate = asyncio.Event()
    held = asyncio.create_task(mesh.call(payload="held", context={"user_id": "ann"}))
    await wait_for(lambda: home.inflight == 1, what="ann's call held")
    home.gate.set()
    assert (await held).route["instance"] == homes["ann"]
    # Without a sticky key, idle instances share the calls.
    free = {(await mesh.call(payload=i)).route["instance"] for i in range(30)}
    assert len(free) == 3


async def test_healthy_instances_first_demoted_only_when_none_left(start_mesh, start_agent):
    mesh: Mesh = await start_mesh(silence_timeout=1.0)
    alive, silent = await start_agent("alive"), await start_agent("silent")
    await mesh.add_all([alive, silent])
    mesh.keep_beating("alive")
    await mesh.until_state("silent", "demoted")
    answers = [await mesh.call(payload=i) for i in range(10)]
    assert {answer.route["instance"] for answer in answers} == {"alive"}
    assert all(not answer.route.get("degraded") for answer in answers)
    assert silent.calls == 0
    mesh.stop_beating("alive")
    await mesh.until_state("alive", "demoted")
    answers = [await mesh.call(payload=i, headers={"X-Reach-Route-Headers": "on"}) for i in range(20)]
    assert all(answer.status == 200 for answer in answers)
    assert all(answer.route["degraded"] is True and answer.route["reason"] == "demoted" for answer in answers)
    assert answers[0].headers["X-Reach-Degraded"] == "true"
    assert silent.calls > 0 and alive.calls > 10
    assert (await mesh.reach_totals())["degraded"] >= 20


async def _kill_under_load(mesh: Mesh, agents: list[Agent]) -> tuple[list[tuple[float, Answer]], float]:
    """Run continuous calls, kill ``agents[1]`` once it has taken some, go on 1.3 s more."""
    victim = agents[1]
    victim.first_byte_delay = 0.01  # so calls are in flight on it when it dies
    killed_at: list[float] = []

    async def kill_midway() -> None:
        await wait_for(lambda: victim.calls >= 30, what="the victim to take load")
        await victim.kill()
        killed_at.append(time.monotonic())

    killer = asyncio.create_task(kill_midway())
    answers = await run_load(lambda: mesh.call(payload="x"), concurrency=6,
                             until=lambda: bool(killed_at) and time.monotonic() > killed_at[0] + 1.3)
    await killer
    return answers, killed_at[0]


async def test_failover_when_an_agent_is_killed_under_load(mesh: Mesh, start_agent, router_logs):
    # Idempotent with retries: even the calls the victim had in flight when it died are delivered.
    await mesh.put_policy("echo", {"retry": {"enabled": True, "max_attempts": 2}})
    agents = [await start_agent(f"fo-{i}") for i in range(3)]
    await mesh.add_all(agents, idempotent=True)
    answers, killed_at = await _kill_under_load(mesh, agents)
    failed = [answer.body for _, answer in answers if answer.status != 200]
    assert len(answers) > 100 and not failed, failed
    rerouted = [answer for _, answer in answers if answer.route["attempts"] > 1]
    assert rerouted, "some call must have met the dead instance and gone elsewhere"
    assert all(answer.route["degraded"] and answer.route["reason"] == "failover" for answer in rerouted)
    assert all(answer.route["instance"] != "fo-1" for answer in rerouted)
    # Passive ejection: a second after the death, calls no longer even try the dead instance.
    late = [answer for started, answer in answers if started > killed_at + 1.0]
    assert len(late) > 20 and all(answer.route["attempts"] == 1 for answer in late)
    ejected = router_logs.named("instance ejected: connection failed")
    assert ejected and {line["instance"] for line in ejected} == {"fo-1"}
    assert ejected[0]["capability"] == "echo" and ejected[0]["request_id"]
    reach = await mesh.reach_totals()
    assert reach["reach_rate"] == 1.0 and reach["degraded"] == len(rerouted)


async def test_a_killed_agent_fails_only_its_calls_in_flight_when_not_idempotent(mesh: Mesh, start_agent):
    agents = [await start_agent(f"ni-{i}") for i in range(3)]
    await mesh.add_all(agents)
    answers, killed_at = await _kill_under_load(mesh, agents)
    failed = [(started, answer) for started, answer in answers if answer.status != 200]
    # A call the agent may have executed is never sent again: it fails with a retryable error...
    for started, answer in failed:
        assert started < killed_at
        assert (answer.status, answer.body["error_code"], answer.body["can_retry"]) == (502, "AGENT_ERROR", True)
        assert answer.route["attempts"] == 1 and answer.route["instance"] == "ni-1"
    sent = Counter(received.headers["X-Request-Id"] for agent in agents for received in agent.received)
    # (at most once: a request written onto a connection the kill had just reset never arrived)
    assert all(sent[answer.body["request_id"]] <= 1 for _, answer in failed)
    # ...and every call sent after the death reaches a live instance (refused connects fail over).
    after = [answer for started, answer in answers if started > killed_at]
    assert len(after) > 50 and all(answer.status == 200 for answer in after)
    assert all(answer.route["instance"] != "ni-1" for answer in after)


async def test_refused_connection_fails_over_even_for_a_non_idempotent_capability(mesh: Mesh, start_agent):
    dead, alive = await start_agent("dead"), await start_agent("alive")
    await mesh.add_all([dead, alive])
    await dead.stop()
    # Idle instances share calls in random order, so call until the dead one has been tried (2^-40 odds
    # of never), then a few more: once refused, it is ejected and not tried again.
    answers = []
    while not any(answer.route["attempts"] == 2 for answer in answers):
        assert len(answers) < 40, "the dead instance was never tried"
        answers.append(await mesh.call(payload=len(answers)))
    answers += [await mesh.call(payload=len(answers) + i) for i in range(5)]
    assert all(answer.status == 200 and answer.route["instance"] == "alive" for answer in answers)
    assert sum(answer.route["attempts"] == 2 for answer in answers) == 1
    assert alive.calls == len(answers)


async def test_panic_routes_to_an_ejected_instance_rather_than_to_none(mesh: Mesh, start_agent):
    only = await start_agent("only")
    await mesh.add(only)
    port = only.port
    await only.stop()
    first = await mesh.call(payload=1)
    assert first.status == 502 and first.body["error_code"] == "AGENT_ERROR"
    # The one instance is ejected now; below the panic threshold it is still tried, so it is
    # back in use the moment it listens again instead of waiting out its ejection.
    revived = await Agent("only").start(port)
    try:
        answer = await mesh.call(payload=2)
        assert answer.status == 200 and answer.route["instance"] == "only"
    finally:
        await revived.stop()


