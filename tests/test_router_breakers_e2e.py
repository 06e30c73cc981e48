"""Circuit breakers and fallback end to end: open, half-open, close; business errors count; fallback."""

from __future__ import annotations

import time

from agent_support import Agent
from conftest import wait_for
from router_support import Answer, Mesh

BREAKER = {"min_requests": 4, "error_threshold_percent": 50, "reset_seconds": 0.5, "window_seconds": 10}


async def lone_agent(mesh: Mesh, start_agent, name: str, protocol: str = "rest", **knobs) -> Agent:
    """One instance of `echo` behind the small breaker policy, misbehaving as ``knobs`` say."""
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER})
    agent = await start_agent(name, protocol)
    for knob, value in knobs.items():
        setattr(agent, knob, value)
    await mesh.add(agent)
    return agent


async def probe_reaches_agent(mesh: Mesh, name: str = "echo") -> Answer:
    """Call until an answer is not CIRCUIT_OPEN: the half-open probe (with a deadline)."""
    async def call() -> Answer | None:
        answer = await mesh.call(name, payload="probe")
        return None if answer.body.get("error_code") == "CIRCUIT_OPEN" else answer
    return await wait_for(call, timeout=5, what="the breaker to let a probe through")


async def test_breaker_opens_half_opens_and_closes(mesh: Mesh, start_agent):
    agent = await lone_agent(mesh, start_agent, "flaky", status=500)
    for _ in range(4):
        assert (await mesh.call(payload="x")).body["error_code"] == "AGENT_ERROR"
    opened_at = time.monotonic()
    # Open: the call is refused at once and the agent is spared.
    refused = await mesh.call(payload="x")
    assert refused.status == 503
    assert (refused.body["error_code"], refused.body["can_retry"]) == ("CIRCUIT_OPEN", True)
    assert refused.route["reason"] == "capability_circuit_open" and agent.calls == 4
    # Half-open after reset_seconds: one probe reaches the agent; it fails, so the breaker reopens.
    probe = await probe_reaches_agent(mesh)
    assert time.monotonic() - opened_at >= 0.5
    assert probe.body["error_code"] == "AGENT_ERROR" and agent.calls == 5
    assert (await mesh.call(payload="x")).body["error_code"] == "CIRCUIT_OPEN" and agent.calls == 5
    # The agent recovers: the next probe succeeds and closes the breaker; calls flow again.
    agent.status = 200
    probe = await probe_reaches_agent(mesh)
    assert probe.status == 200 and agent.calls == 6
    answers = [await mesh.call(payload=i) for i in range(5)]
    assert all(answer.status == 200 for answer in answers) and agent.calls == 11
    metrics = await mesh.get("/metrics")
    assert 'agentreach_router_breaker_open{capability="echo",instance=""} 0.0' in metrics


async def test_an_instance_breaker_moves_traffic_to_the_other_instances(mesh: Mesh, start_agent):
    # Retries keep the capability's calls succeeding, so only the bad instance's breaker opens.
    await mesh.put_policy("echo", {"circuit_breaker": {**BREAKER, "min_requests": 3, "reset_seconds": 30},
                                   "retry": {"enabled": True, "max_attempts": 2}})
    bad, good = await start_agent("bad"), await start_agent("good")
    bad.status = 500
    await mesh.add_all([bad, good], idempotent=True)
    answers = []
    while bad.calls < 3:
        answers.append(await mesh.call(payload="x"))
        assert len(answers) < 200, "least-load never tried the bad instance"
    answers += [await mesh.call(payload=i) for i in range(20)]
    assert all(answer.status == 200 for answer in answers)
    assert bad.calls == 3, "an open instance breaker takes the instance out of rotation"
    metrics = await mesh.get("/metrics")
    assert 'agentreach_router_breaker_open{capability="echo",instance="bad"} 1.0' in metrics
    assert 'agentreach_router_breaker_open{capability="echo",instance="good"} 0.0' in metrics


async def test_business_errors_open_the_breaker_and_count_as_failures(mesh: Mesh, start_agent):
    agent = await lone_agent(mesh, start_agent, "refuser", "atp",
                             business_error={"code": "OUT_OF_STOCK", "message": "nothing left"})
    for _ in range(4):
        answer = await mesh.call(payload="x")
        assert answer.status == 422 and answer.body["error_code"] == "BUSINESS_ERROR"
        assert answer.body["business_error"]["code"] == "OUT_OF_STOCK"
    assert (await mesh.call(payload="x")).body["error_code"] == "CIRCUIT_OPEN"
    assert agent.calls == 4
    reach = await mesh.reach_totals()
    assert reach["failed_by_code"] == {"BUSINESS_ERROR": 4, "CIRCUIT_OPEN": 1} and reach["reach_rate"] == 0.0


async def test_an_agent_answering_busy_does_not_open_the_breaker(mesh: Mesh, start_agent):
    agent = await lone_agent(mesh, start_agent, "full", status=429)
    for _ in range(6):
        answer = await mesh.call(payload="x")
        assert (answer.status, answer.body["error_code"], answer.body["can_retry"]) == (429, "BUSY", True)
    agent.status = 200
    assert (await mesh.call(payload="x")).status == 200 and agent.calls == 7


async def test_fallback_capability_answers_degraded_while_the_primary_fails(mesh: Mesh, start_agent):
    await mesh.put_policy("primary", {"circuit_breaker": {**BREAKER, "reset_seconds": 30},
                                      "fallback_capability": "backup"})
    primary, backup = await start_agent("primary-1"), await start_agent("backup-1")
    primary.status = 500
    await mesh.add(primary, "primary", healthy=False)
    await mesh.add(backup, "backup", healthy=False)
    await mesh.ready("primary-1", "backup-1")
    answers = [await mesh.call("primary", payload=i, headers={"X-Reach-Route-Headers": "on"}) for i in range(8)]
    for answer in answers:
        assert answer.status == 200 and answer.body["result"]["agent"] == "backup-1"
        assert answer.route["degraded"] and answer.route["reason"] == "fallback"
        assert answer.route["capability"] == "backup" and answer.route["instance"] == "backup-1"
        assert answer.headers["X-Reach-Reason"] == "fallback"
    assert primary.calls == 4, "the primary's breaker opened after min_requests failures"
    assert backup.calls == 8
    reach = await mesh.reach_totals("primary")
    assert (reach["total"], reach["degraded"], reach["reach_rate"], reach["raw_success_rate"]) == (8, 8, 1.0, 0.0)
    # When the fallback fails as well, the caller gets the primary's own error.
    backup.status = 500
    answer = await mesh.call("primary", payload="both down")
    assert answer.status == 503 and answer.body["error_code"] == "CIRCUIT_OPEN"
    assert answer.route["capability"] == "primary"


async def test_an_empty_pool_is_no_routable_instance_or_the_fallback(mesh: Mesh, start_agent):
    await mesh.put_policy("lonely", {"policy": "least_load"})
    answer = await mesh.call("lonely", payload="x")
    assert answer.status == 503
    assert (answer.body["error_code"], answer.body["can_retry"]) == ("NO_ROUTABLE_INSTANCE", True)
    backup = await start_agent("backup-2")
    await mesh.add(backup, "backup")
    await mesh.put_policy("lonely", {"fallback_capability": "backup"})
    answer = await mesh.call("lonely", payload="x")
    assert answer.status == 200 and answer.route["reason"] == "fallback" and backup.calls == 1
