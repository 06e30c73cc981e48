"""The instance lifecycle against a real registry and real agents' /healthz, with small knobs."""

from __future__ import annotations

import logging
import time

from conftest import FakeAgent, post, registration, wait_for

FAST = {"silence_timeout": 0.5, "health_interval": 0.1, "evict_after": 3}


async def state_of(http, registry, agent_id):
    async with http.get(f"{registry.url}/agents/{agent_id}") as response:
        return (await response.json())["state"]


async def test_pending_healthy_demoted_evicted(start_registry, http, agent):
    # Checks 0.3 s apart: the demoted instance stays queryable for ~1 s even on a loaded machine.
    registry = await start_registry(**{**FAST, "health_interval": 0.3})
    await post(http, f"{registry.url}/register", registration("a1", "life.cap", base_url=agent.url))
    assert await state_of(http, registry, "a1") == "pending"
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.2})
    assert await state_of(http, registry, "a1") == "healthy"
    agent.healthy = False
    await wait_for(lambda: _is(http, registry, "a1", "demoted"), what="demoted after silence")
    # Still offered while demoted, so callers can use it when nothing better is left.
    status, body = await post(http, f"{registry.url}/query", {"capability": "life.cap"})
    assert status == 200 and body["instances"][0]["state"] == "demoted"
    revision = registry.store.revision
    await wait_for(lambda: _is(http, registry, "a1", "evicted"), what="evicted after failed checks")
    assert agent.health_checks >= 3
    assert registry.store.revision == revision + 1  # the eviction is in the WAL
    status, body = await post(http, f"{registry.url}/query", {"capability": "life.cap"})
    assert status == 404
    # An evicted instance is told to register again.
    status, body = await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.2})
    assert status == 404 and body["error"] == "unknown_agent"


async def _is(http, registry, agent_id, state):
    return await state_of(http, registry, agent_id) == state


async def test_passing_health_check_makes_demoted_healthy_again(start_registry, http, agent):
    registry = await start_registry(**FAST)
    await post(http, f"{registry.url}/register", registration("a1", "life.cap", base_url=agent.url))
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.2})
    agent.healthy = False
    await wait_for(lambda: registry.registry.state.liveness["a1"].failed_checks >= 1, what="a failed check")
    agent.healthy = True
    await wait_for(lambda: _is(http, registry, "a1", "healthy"), what="healthy after passing check")
    assert registry.registry.state.liveness["a1"].failed_checks == 0


async def test_heartbeat_before_eviction_restores(start_registry, http, agent):
    registry = await start_registry(silence_timeout=0.3, health_interval=0.1, evict_after=1000)
    agent.healthy = False
    await post(http, f"{registry.url}/register", registration("a1", "life.cap", base_url=agent.url))
    await wait_for(lambda: _is(http, registry, "a1", "demoted"), what="demoted")
    status, body = await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.9})
    assert status == 200 and body["state"] == "healthy"
    assert await state_of(http, registry, "a1") == "healthy"


async def test_heartbeats_are_judged_on_the_registry_clock(start_registry, http, agent):
    # The heartbeat carries no sender time at all; its arrival is what counts.
    registry = await start_registry(silence_timeout=0.5, health_interval=60)
    await post(http, f"{registry.url}/register", registration("a1", "life.cap", base_url=agent.url))
    await wait_for(lambda: _is(http, registry, "a1", "demoted"), what="demoted")
    sent = time.monotonic()
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.1})
    async with http.get(f"{registry.url}/agents/a1") as response:
        body = await response.json()
    # Stamped when it arrived: no older than the time since it was sent (ms, rounded down by the registry).
    assert body["state"] == "healthy" and body["last_heartbeat_ms_ago"] <= (time.monotonic() - sent) * 1000


async def test_eviction_guard_pauses_mass_eviction(start_registry, http, caplog):
    registry = await start_registry(silence_timeout=0.3, health_interval=0.1, evict_after=2)
    dead = FakeAgent()
    await dead.start()
    dead.healthy = False
    try:
        for i in range(5):
            await post(http, f"{registry.url}/register", registration(f"a{i}", f"cap.{i}", base_url=dead.url))
        with caplog.at_level(logging.ERROR, logger="agentreach.registry.health"):
            await wait_for(lambda: _metric(http, registry, "agentreach_registry_eviction_guard_active", 1.0),
                           what="guard on")
            await wait_for(lambda: dead.health_checks >= 5 * 4, what="several failed sweeps")
        assert any("EVICTION GUARD ON" in r.getMessage() for r in caplog.records)
        states = {a.agent_id: a.state for a in registry.registry.agents()}
        assert set(states.values()) == {"demoted"}
        # Four come back: only one is silent now, the guard lifts and the silent one is evicted.
        for i in range(4):
            await post(http, f"{registry.url}/heartbeat", {"agent_id": f"a{i}", "load": 0.1})
        async def beat():
            for i in range(4):
                await post(http, f"{registry.url}/heartbeat", {"agent_id": f"a{i}", "load": 0.1})
            return registry.registry.agent("a4").state == "evicted"

        await wait_for(beat, what="a4 evicted once the guard lifts")
        assert await _metric(http, registry, "agentreach_registry_eviction_guard_active", 0.0)
        assert [a.state for a in registry.registry.agents() if a.agent_id != "a4"] == ["healthy"] * 4
    finally:
        await dead.stop()


async def _metric(http, registry, name, value):
    async with http.get(f"{registry.url}/metrics") as response:
        text = await response.text()
    return f"{name} {value}" in text
