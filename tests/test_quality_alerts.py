"""A live instance scored below its capability's quality floor alerts at the registry (GET /quality, a
warning in the log) until its score, the floor or its registration says otherwise (issue 15)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from conftest import call
from log_support import LogLines
from mesh.policy import Policy
from mesh.quality import QualityScore, quality_alerts
from registry.server import RegistryServer
from test_quality_records import scored_mesh

Start = Callable[..., Awaitable[RegistryServer]]


class Scored:
    def __init__(self, registry: RegistryServer, http: aiohttp.ClientSession):
        self.registry, self.http = registry, http

    async def send(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await call(self.http, method, f"{self.registry.url}{path}", body=body)
        assert status == 200, answer
        return answer

    async def gauge(self) -> float:
        async with self.http.get(f"{self.registry.url}/metrics") as response:
            text = await response.text()
        return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                    if sample.name == "agentreach_registry_quality_alerts_active")

    async def alerting(self) -> list[tuple[str, str, float, float]]:
        alerts = (await self.send("GET", "/quality"))["alerts"]
        return [(a["capability"], a["agent_id"], a["score"], a["floor"]) for a in alerts]


def raised_and_cleared(logs: LogLines) -> list[tuple[str, str]]:
    return [(line["state"], line["agent_id"]) for line in logs.named("quality_alert")]


async def test_an_alert_is_raised_below_the_floor_and_cleared_when_restored(
        registry: RegistryServer, http: aiohttp.ClientSession, router_logs: LogLines) -> None:
    await scored_mesh(registry, http)
    scored = Scored(registry, http)
    await scored.send("PUT", "/quality/ticket.triage/triage-b", {"score": 0.2, "source": "golden-set"})
    assert await scored.alerting() == []  # no floor yet: nothing to fall below
    await scored.send("PUT", "/policies/ticket.triage", {"quality_floor": 0.5})
    assert await scored.alerting() == [("ticket.triage", "triage-b", 0.2, 0.5)] and await scored.gauge() == 1
    listed = await scored.send("GET", "/quality/ticket.triage")
    assert [(v["agent_id"], v["floor"], v["below_floor"]) for v in listed] == [("triage-b", 0.5, True)]
    # A score at the floor is enough; another instance falling below raises its own alert.
    await scored.send("PUT", "/quality/ticket.triage/triage-b", {"score": 0.5})
    await scored.send("PUT", "/quality/ticket.triage/triage-a", {"score": 0.1})
    assert await scored.alerting() == [("ticket.triage", "triage-a", 0.1, 0.5)]
    await scored.send("PUT", "/policies/ticket.triage", {"quality_floor": 0.05})
    assert await scored.alerting() == [] and await scored.gauge() == 0
    assert raised_and_cleared(router_logs) == [
        ("active", "triage-b"), ("resolved", "triage-b"),
        ("active", "triage-a"), ("resolved", "triage-a")]
    raised = router_logs.named("quality_alert")[0]
    assert raised["capability"] == "ticket.triage" and raised["score"] == 0.2 and raised["floor"] == 0.5
    assert raised["source"] == "golden-set" and raised["level"] == "warning"


async def test_an_instance_leaving_clears_its_alert_and_coming_back_raises_it(
        registry: RegistryServer, http: aiohttp.ClientSession) -> None:
    await scored_mesh(registry, http)
    scored = Scored(registry, http)
    await scored.send("PUT", "/policies/ticket.triage", {"quality_floor": 0.5})
    await scored.send("PUT", "/quality/ticket.triage/triage-b", {"score": 0.2})
    await scored.send("POST", "/deregister", {"agent_id": "triage-b"})
    assert await scored.alerting() == []
    await scored_mesh(registry, http)  # the same agent_id registers again: its score still stands
    assert await scored.alerting() == [("ticket.triage", "triage-b", 0.2, 0.5)]
    await scored.send("DELETE", "/quality/ticket.triage/triage-b")
    assert await scored.alerting() == []


async def test_an_alert_stands_after_a_restart(start_registry: Start, http: aiohttp.ClientSession, tmp_path: Any,
                                               router_logs: LogLines) -> None:
    data_dir = tmp_path / "alerting"
    registry = await start_registry(data_dir)
    await scored_mesh(registry, http)
    await Scored(registry, http).send("PUT", "/policies/ticket.triage", {"quality_floor": 0.5})
    await Scored(registry, http).send("PUT", "/quality/ticket.triage/triage-a", {"score": 0.3})
    await registry.stop()
    router_logs.lines.clear()

    restarted = await start_registry(data_dir)
    assert await Scored(restarted, http).alerting() == [("ticket.triage", "triage-a", 0.3, 0.5)]
    assert raised_and_cleared(router_logs) == [("active", "triage-a")]


def test_alerts_need_a_floor_a_live_instance_and_a_score_below() -> None:
    scores = {"a": {"x": QualityScore(score=0.2), "y": QualityScore(score=0.6), "gone": QualityScore(score=0.0)},
              "b": {"x": QualityScore(score=0.0)}}
    policies = {"a": Policy(quality_floor=0.6), "b": Policy()}
    alerts = quality_alerts(scores, policies, {"a": {"x", "y"}, "b": {"x"}})
    assert [(alert.capability, alert.agent_id, alert.floor) for alert in alerts] == [("a", "x", 0.6)]
