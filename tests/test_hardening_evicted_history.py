"""Evicted instance records are history with a bound: the newest 1,000, for a day at most."""

from __future__ import annotations

from conftest import post, registration
from mesh.records import InstanceRecord
from registry.lifecycle import LifecycleConfig
from registry.retention import evicted_to_forget

EVICTED_MAX_AGE = LifecycleConfig().evicted_max_age


def _record(agent_id: str, evicted_at: float | None) -> InstanceRecord:
    return InstanceRecord(agent_id=agent_id, service="s", capabilities=[], health_url="http://127.0.0.1:9/healthz",
                          evicted_at=evicted_at)


def test_the_oldest_past_the_bound_and_the_expired_are_forgotten_oldest_first():
    records = [_record("live", None)] + [_record(f"e{n}", 100.0 + n) for n in (4, 0, 3, 1, 2)]
    assert evicted_to_forget(records, now=200.0, kept=2, max_age=EVICTED_MAX_AGE) == ["e0", "e1", "e2"]
    assert evicted_to_forget(records, now=200.0, kept=10, max_age=EVICTED_MAX_AGE) == []
    assert evicted_to_forget(records, now=102.5 + EVICTED_MAX_AGE, kept=10,
                             max_age=EVICTED_MAX_AGE) == ["e0", "e1", "e2"]


async def test_evicted_records_older_than_a_day_are_released_and_their_ids_stay_bound(start_registry, http, tmp_path):
    data_dir = tmp_path / "history"
    server = await start_registry(data_dir)
    now = [1_000_000.0]
    server.registry._wall_clock = lambda: now[0]
    for n in range(3):
        status, _ = await post(http, f"{server.url}/register", registration(f"a{n}", f"cap.{n}", service="s"))
        assert status == 200
    await server.registry.evict("a0", "test")
    await server.registry.evict("a1", "test")
    now[0] += EVICTED_MAX_AGE + 1
    await server.registry.evict("a2", "test")

    async with http.get(f"{server.url}/agents") as response:
        agents = {agent["agent_id"]: agent["state"] for agent in (await response.json())["agents"]}
    assert agents == {"a2": "evicted"}
    status, body = await post(http, f"{server.url}/register", registration("a0", "cap.other", service="other"))
    assert (status, body["field"]) == (409, "agent_id")
    await server.stop()
    again = await start_registry(data_dir)
    assert {agent.agent_id for agent in again.registry.agents()} == {"a2"}
