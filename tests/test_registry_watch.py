"""GET /watch: the full state, then ordered changes with a revision, resumable by revision."""

from __future__ import annotations

import asyncio

import msgspec

from conftest import post, registration


async def read_events(response, count, skip=("ping",)):
    events = []
    while len(events) < count:
        line = await asyncio.wait_for(response.content.readline(), timeout=10)
        event = msgspec.json.decode(line)
        if event["type"] not in skip:
            events.append(event)
    return events


async def test_watch_sends_state_then_changes_and_resumes(start_registry, http, agent):
    registry = await start_registry(silence_timeout=60, health_interval=60)
    await post(http, f"{registry.url}/register", registration("a1", "w.one", base_url=agent.url))
    async with http.get(f"{registry.url}/watch") as response:
        assert response.status == 200
        (reset,) = await read_events(response, 1)
        assert reset["type"] == "reset" and reset["revision"] == 1
        assert reset["records"]["instances/a1"]["capabilities"][0]["name"] == "w.one"
        assert reset["states"]["a1"][0] == "pending"
        await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.4})
        (states,) = await read_events(response, 1)
        assert states == {"type": "states", "states": {"a1": ["healthy", 0.4, None]}}
        await post(http, f"{registry.url}/register", registration("a2", "w.two", base_url=agent.url))
        async with http.put(f"{registry.url}/policies/w.two", json={"policy": "hash"}) as answer:
            assert answer.status == 200
        await post(http, f"{registry.url}/deregister", {"agent_id": "a1"})
        changes = await read_events(response, 4, skip=("ping", "states"))
    # Deregistering keeps the agent_id bound to its service (agent-ids/a1) before deleting the instance.
    assert [(e["type"], e["revision"], e["key"]) for e in changes] == [
        ("put", 2, "instances/a2"), ("put", 3, "policies/w.two"), ("put", 4, "agent-ids/a1"),
        ("delete", 5, "instances/a1")]
    assert changes[1]["value"]["policy"] == "hash"
    # A follower that saw revision 2 resumes with exactly what came after it.
    async with http.get(f"{registry.url}/watch?since=2") as response:
        resumed = await read_events(response, 4)
    assert [(e["type"], e.get("revision")) for e in resumed] == [("put", 3), ("put", 4), ("delete", 5),
                                                                  ("states", None)]


async def test_watch_rejects_a_bad_revision(registry, http):
    async with http.get(f"{registry.url}/watch?since=abc") as response:
        assert response.status == 400 and (await response.json())["field"] == "since"


async def test_watch_publishes_demotion_when_the_silence_timeout_runs_out(start_registry, http, agent):
    registry = await start_registry(silence_timeout=0.4, health_interval=60)
    await post(http, f"{registry.url}/register", registration("quiet", "w.q", base_url=agent.url))
    await post(http, f"{registry.url}/register", registration("chatty", "w.c", base_url=agent.url))
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "quiet", "load": 0.1})
    async with http.get(f"{registry.url}/watch") as response:
        (reset,) = await read_events(response, 1)
        assert reset["states"]["quiet"][0] == "healthy"
        # Each instance is published when its silence runs out (pending and healthy both demote).
        published: dict[str, list[str]] = {}
        while published.get("quiet", [None])[0] != "demoted":
            (event,) = await read_events(response, 1)
            assert event["type"] == "states"
            for agent_id, state in event["states"].items():
                published.setdefault(agent_id, []).append(state[0])
        assert published["quiet"] == ["demoted"]
        assert set(published) <= {"quiet", "chatty"} and published.get("chatty", ["demoted"]) == ["demoted"]
