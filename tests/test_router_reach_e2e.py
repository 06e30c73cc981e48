"""Reach-rate accounting end to end: a scripted mix of outcomes read back from /reach and /metrics,
and a reach alert firing and resolving over real periods."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_for
from mesh.alerts import AlertConfig
from router.core import RouterSettings
from router_support import Mesh


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def test_reach_numbers_after_a_scripted_mix(start_mesh, start_agent):
    mesh: Mesh = await start_mesh(routing=RouterSettings(period_seconds=3600))
    await mesh.put_policy("mix", {"fallback_capability": "mix.backup", "timeout": {"first_byte_ms": 400}})
    main, backup, sleeper = await start_agent("main"), await start_agent("backup"), await start_agent("sleeper")
    await mesh.add(main, "mix", healthy=False)
    await mesh.add(backup, "mix.backup", healthy=False)
    await mesh.add(sleeper, "other", healthy=False)  # registered, never heard from: pending
    await mesh.ready("main", "backup")
    expected = []

    async def step(count: int, status: int, code: str | None = None, **knobs) -> None:
        for _ in range(count):
            answer = await mesh.call("mix", payload="x")
            assert answer.status == status and answer.body.get("error_code") == code, answer.body
            expected.append(answer)
        for agent in (main, backup):
            agent.status, agent.business_error, agent.first_byte_delay = 200, None, 0.0

    await step(5, 200)
    main.business_error = {"code": "REFUSED"}
    await step(2, 422, "BUSINESS_ERROR")  # the agent's answer: no fallback
    main.status, backup.status = 500, 500
    await step(1, 502, "AGENT_ERROR")  # the fallback failed too
    main.status, backup.status = 429, 500
    await step(1, 429, "BUSY")
    main.first_byte_delay, backup.status = 1.2, 500
    await step(1, 504, "FIRST_BYTE_TIMEOUT")
    main.status = 500
    await step(2, 200)  # rescued by the fallback: degraded
    # Calls that never named a capability's pool are nobody's reach: not counted.
    assert (await mesh.call("no.such.thing")).status == 404
    assert (await mesh.post(None, raw=b"{oops")).status == 400

    reach = await mesh.get("/reach?capability=mix")
    [period] = reach["periods"]
    assert period["capability"] == "mix" and period["closed"] is False
    assert period["end"] - period["start"] == 3600
    assert (period["total"], period["success"], period["degraded"], period["failed"]) == (12, 5, 2, 5)
    assert period["failed_by_code"] == {"BUSINESS_ERROR": 2, "AGENT_ERROR": 1, "BUSY": 1, "FIRST_BYTE_TIMEOUT": 1}
    assert period["raw_success_rate"] == 5 / 12 and period["reach_rate"] == 7 / 12
    assert sum(period["latency_buckets"]) == 12 and period["latency_p99_ms"] >= period["latency_p50_ms"] > 0
    assert reach["instance_health_rate"] == 2 / 3
    assert reach["route_decisions"]["fallback"] == 2
    everything = await mesh.get("/reach")
    assert {p["capability"] for p in everything["periods"]} == {"mix"}

    metrics = samples(await mesh.get("/metrics"))
    mix = frozenset({("capability", "mix")})
    for outcome, count in (("success", 5), ("degraded", 2), ("failed", 5)):
        assert metrics[("agentreach_router_calls_total", mix | {("outcome", outcome)})] == count
    for code, count in period["failed_by_code"].items():
        assert metrics[("agentreach_router_failures_total", mix | {("error_code", code)})] == count
    assert metrics[("agentreach_router_call_seconds_count", mix)] == 12
    assert metrics[("agentreach_router_call_seconds_bucket", mix | {("le", "+Inf")})] == 12
    assert metrics[("agentreach_router_reach_rate", mix)] == 7 / 12
    assert metrics[("agentreach_router_success_rate", mix)] == 5 / 12
    assert metrics[("agentreach_router_alerts_active", frozenset())] == 0
    assert metrics[("agentreach_router_registry_revision", frozenset())] == mesh.registry.store.revision
    assert not any(dict(labels).get("capability") == "no.such.thing" for _, labels in metrics)


async def test_an_alert_fires_after_two_bad_periods_and_resolves(start_mesh, start_agent, router_logs):
    alert = AlertConfig(reach_threshold=0.98, consecutive_periods=2, min_failures=4)
    mesh: Mesh = await start_mesh(routing=RouterSettings(period_seconds=0.4, alert=alert))
    await mesh.put_policy("echo", {"circuit_breaker": {"min_requests": 10_000}})
    agent = await start_agent("sick")
    await mesh.add(agent)
    agent.status = 500

    async def active() -> list[dict]:
        await mesh.call(payload="x")
        await asyncio.sleep(0.02)  # pacing the load, not waiting for a result
        alerts = (await mesh.get("/alerts"))["alerts"]
        return [a for a in alerts if a["state"] == "active"]

    [fired] = await wait_for(active, timeout=5, what="the reach alert to fire")
    assert fired["capability"] == "echo" and fired["periods"] == 2 and fired["threshold"] == 0.98
    assert fired["failures"] >= 4 and fired["reach_rate"] < 0.98 and fired["total"] >= fired["failures"]
    assert (await mesh.get("/alerts"))["config"] == {"reach_threshold": 0.98, "consecutive_periods": 2,
                                                     "min_failures": 4}
    metrics = samples(await mesh.get("/metrics"))
    assert metrics[("agentreach_router_alerts_active", frozenset())] == 1
    logged = await wait_for(lambda: [line for line in router_logs.named("reach_alert") if line["state"] == "active"],
                            timeout=3, what="the alert's log event")
    assert logged[0]["capability"] == "echo" and logged[0]["level"] == "error"
    # The agent recovers: the first good period resolves the alert.
    agent.status = 200

    async def resolved() -> list[dict]:
        await mesh.call(payload="x")
        await asyncio.sleep(0.02)
        return [a for a in (await mesh.get("/alerts"))["alerts"] if a["state"] == "resolved"]

    [done] = await wait_for(resolved, timeout=5, what="the alert to resolve")
    assert done["capability"] == "echo" and done["resolved_at"] >= done["fired_at"]
    await wait_for(lambda: [line for line in router_logs.named("reach_alert") if line["state"] == "resolved"],
                   timeout=3, what="the resolution's log event")
