"""`agentreach router --workers 2` seen as one router beyond its metrics: /usage, /rules/stats and /scores on the
shared port answer for every worker, whichever worker the kernel hands the request to. Real processes on loopback,
a real registry and agent, each request on a fresh connection (so it lands on either worker)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from agent_reach.usage import Usage

from conftest import wait_for
from mesh.alerts import AlertConfig
from registry.server import RegistryServer
from router.measurements import ERROR_WINDOW
from router.merged import RuleStats, judged_alerts, merge_reach, merge_rule_stats, merge_usage
from router.reach import Outcome, ReachLedger, ReachView
from router.rules import Decision
from router.shadow import Disagreement, RuleHits, ShadowStats
from router.traffic_mirror import MirrorSample, MirrorStats
from router.usage import OTHER, UsageLedger
from router_support import capability
from sdk_support import free_port, refused_url
from test_workers import Caller, Supervised, register_echo, until_forwarding
from test_workers_metrics import SCRAPES, fresh_get, own_calls

PRICE = 0.25
# Every call is decided by the live rule; one shadow rule would do the same, the other would refuse it.
POLICY = {"rules": [{"id": "live", "priority": 10}, {"id": "same", "priority": 5, "mode": "shadow"},
                    {"id": "refusing", "priority": 6, "mode": "shadow", "action": "refuse"}]}


class Served:
    """A `--workers 2` router in front of a priced echo agent, and the calls it answered."""

    def __init__(self, url: str, caller: Caller, private_dir: Path):
        self.url = url
        self.caller = caller
        self.private_dir = private_dir  # the workers' own views

    async def every_scrape(self, path: str, **params: str) -> Any:
        """``path``'s answer, the same on ``SCRAPES`` fresh connections (else the assertion says how it differs)."""
        answers = []
        for _ in range(SCRAPES):
            response = await fresh_get(f"{self.url}{path}", **params)
            assert response.status == 200, await response.text()
            answers.append(await response.json())
        assert all(answer == answers[0] for answer in answers), answers
        return answers[0]


@pytest.fixture
async def served(registry: RegistryServer, start_agent: Callable[..., Any], tmp_path: Path) -> AsyncIterator[Served]:
    agent = await start_agent("echo-1")
    await register_echo(registry.url, agent, cost_per_call=PRICE)
    async with aiohttp.ClientSession() as http, http.put(f"{registry.url}/policies/echo", json=POLICY) as response:
        assert response.status == 200, await response.text()  # before the workers start: every call sees it
    port = free_port()
    router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", registry.url,
                                    "--auth", "off", "--data-dir", str(tmp_path))
    try:
        ready = await router.wait_logged("workers ready")
        caller = Caller(f"http://127.0.0.1:{port}", "")
        await until_forwarding(caller, ready["pids"], agent.port, router)  # each worker has served calls
        await caller.calls("counted", 20)
        assert caller.failures == []
        yield Served(caller.url, caller, Path(ready["private_dir"]))
    finally:
        await router.close()


async def test_usage_on_the_shared_port_adds_up_every_workers_ledger(served: Served) -> None:
    calls = len(served.caller.answered)
    for period in ("hour", "day"):
        answer = await served.every_scrape("/usage", period=period, capability="echo")
        [whole] = answer["periods"]
        assert (whole["total"]["calls"], whole["total"]["cost"]) == (calls, calls * PRICE)
        assert whole["by_capability"]["echo"]["calls"] == whole["by_instance"]["echo-1"]["calls"] == calls
    assert (await served.every_scrape("/usage", capability="never-called"))["periods"] == []
    refused = await fresh_get(f"{served.url}/usage", period="week")
    assert refused.status == 400 and (await refused.json())["field"] == "period"


def test_merged_usage_keeps_each_workers_overflow_in_one_other_row() -> None:
    ledgers = [UsageLedger(max_keys=1), UsageLedger(max_keys=1)]
    for worker, ledger in enumerate(ledgers):
        ledger.record("a", "echo", "echo-1", Usage(input_tokens=1, cost=0.5), now=7200.0)
        ledger.record(f"late-{worker}", "echo", "echo-1", Usage(output_tokens=2, cost=0.25), now=7201.0)
    ledgers[1].record("a", "echo", "echo-1", Usage(), now=3600.0)
    [earlier, hour] = merge_usage({worker: ledger.periods("hour") for worker, ledger in enumerate(ledgers)})
    assert (earlier.start, earlier.total.calls, hour.start) == (3600, 1, 7200)
    assert {name: (used.calls, used.input_tokens, used.output_tokens, used.cost)
            for name, used in hour.by_client.items()} == {"a": (2, 2, 0, 1.0), OTHER: (2, 0, 4, 0.5)}
    assert hour.by_capability.keys() == {"echo", OTHER} and hour.total.calls == 4


async def test_rule_stats_on_the_shared_port_add_up_every_workers_rule_book(served: Served) -> None:
    calls = len(served.caller.answered)
    stats = await served.every_scrape("/rules/stats", capability="echo")
    assert [(hit["rule"], hit["calls"]) for hit in stats["hits"]] == [("live", calls)]
    assert [(row["rule"], row["agree"], row["disagree"]) for row in stats["shadow"]] == [
        ("refusing", 0, calls), ("same", calls, 0)]
    samples = stats["shadow"][0]["samples"]
    assert len(samples) == 5 and [sample["at"] for sample in samples] == sorted(sample["at"] for sample in samples)
    assert {sample["would"]["action"] for sample in samples} == {"refuse"}
    assert (await served.every_scrape("/rules/stats", capability="other")) == {"hits": [], "shadow": [], "mirror": []}


def test_merged_rule_stats_add_up_per_rule_and_keep_the_newest_samples_of_all_workers() -> None:
    def disagreement(at: float) -> Disagreement:
        return Disagreement(at=at, would=Decision("echo", action="refuse"), did=Decision("echo"))

    def copy(at: float) -> MirrorSample:
        return MirrorSample(at=at, request_id=str(at), instance="b", live="success", mirror="TIMEOUT", live_ms=1,
                            mirror_ms=2)

    own_shadow = ShadowStats(capability="echo", rule="s", agree=1, disagree=3,
                             samples=[disagreement(at) for at in (1, 4, 6)])
    views = {
        1: RuleStats(hits=[RuleHits(capability="echo", rule="r", calls=2)],
                     shadow=[ShadowStats(capability="echo", rule="s", agree=2, disagree=3,
                                         samples=[disagreement(at) for at in (2, 3, 5)])],
                     mirror=[MirrorStats(capability="echo", version="2", sent=1, different_status=1, live_ms_sum=1,
                                         mirror_ms_sum=2, samples=[copy(9)])]),
        0: RuleStats(hits=[RuleHits(capability="echo", rule="r", calls=1), RuleHits(capability="a", rule="r", calls=1)],
                     shadow=[own_shadow],
                     mirror=[MirrorStats(capability="echo", version="2", sent=2, skipped=1, same_status=1,
                                         different_status=1, live_ms_sum=3, mirror_ms_sum=4, samples=[copy(8)])])}
    whole = merge_rule_stats(views)
    assert [(hit.capability, hit.calls) for hit in whole.hits] == [("a", 1), ("echo", 3)]
    [shadow] = whole.shadow
    assert (shadow.agree, shadow.disagree, [sample.at for sample in shadow.samples]) == (3, 6, [2, 3, 4, 5, 6])
    assert (own_shadow.agree, len(own_shadow.samples)) == (1, 3)  # the answering worker's own record untouched
    [mirror] = whole.mirror
    assert (mirror.sent, mirror.skipped, mirror.same_status, mirror.different_status, mirror.live_ms_sum,
            mirror.mirror_ms_sum, [sample.at for sample in mirror.samples]) == (3, 1, 1, 2, 4, 6, [8, 9])


async def test_scores_on_the_shared_port_list_every_workers_own_measurements(served: Served) -> None:
    answer = await served.every_scrape("/scores/echo")
    assert (answer["capability"], answer["policy"]) == ("echo", "least_load")
    rows = answer["instances"]
    assert [(row["worker"], row["agent_id"]) for row in rows] == [(0, "echo-1"), (1, "echo-1")]
    # Each worker's own figures, not an average: the calls it served, up to its error window.
    for row in rows:
        assert row["latency_ms"] is not None
        assert row["samples"] == min(ERROR_WINDOW, await own_calls(served.private_dir, row["worker"])) > 0
    unknown = await fresh_get(f"{served.url}/scores/never-offered")
    assert unknown.status == 404 and (await unknown.json())["error"] == "unknown_capability"


async def own_view(private_dir: Path, index: int, path: str, kind: Any, **params: str) -> Any:
    """Worker ``index``'s own view at ``path``, from its private socket."""
    connector = aiohttp.UnixConnector(path=str(private_dir / f"worker-{index}.sock"))
    async with aiohttp.ClientSession(connector=connector) as session, \
            session.get(f"http://worker{path}", params=params) as response:
        return msgspec.msgpack.decode(await response.read(), type=kind)


async def test_alerts_on_the_shared_port_are_judged_on_every_workers_calls(
        served: Served, registry: RegistryServer) -> None:
    """Failures split between the workers: neither alone reaches min_failures, the router does."""
    body = {"agent_id": "dead-1", "service": "dead",
            "capabilities": [capability("dead", f"{refused_url()}/call")]}
    async with aiohttp.ClientSession() as http:
        for path, payload in (("/register", body), ("/heartbeat", {"agent_id": "dead-1"})):
            async with http.post(f"{registry.url}{path}", json=payload) as response:
                assert response.status == 200, await response.text()
    for n in range(30):
        frame = {"capability": "dead", "payload": {}, "request_id": f"dead-{n}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
                session.post(f"{served.url}/atp", json=frame) as response:
            await response.read()
    whole = await served.every_scrape("/reach", capability="dead")
    worst = max(whole["periods"], key=lambda period: period["failed"])
    shares = [period.failed for index in (0, 1)
              for period in (await own_view(served.private_dir, index, "/reach", ReachView, capability="dead")).periods
              if period.start == worst["start"]]
    assert len(shares) == 2 and sum(shares) == worst["failed"] and max(shares) < worst["failed"]
    config = {"reach_threshold": 0.98, "consecutive_periods": 1, "min_failures": worst["failed"]}
    async with aiohttp.ClientSession() as http, http.put(f"{registry.url}/settings/alerts", json=config) as response:
        assert response.status == 200, await response.text()

    async def both_under(settings: dict[str, Any]) -> bool:
        views = [await own_view(served.private_dir, index, "/alerts", dict[str, Any]) for index in (0, 1)]
        return all(view["config"] == settings for view in views)
    # Each worker picks the settings up from the registry on its own; until both have, they judge differently.
    await wait_for(lambda: both_under(config), timeout=30, what="both workers under the new alert settings")

    async def fired() -> list[Any]:
        response = await fresh_get(f"{served.url}/alerts")
        return [alert for alert in (await response.json())["alerts"] if alert["capability"] == "dead"]
    # The period closes within a minute (the router's period); each worker judges it on its own share too.
    await wait_for(fired, timeout=150, what="the router's reach alert on dead")
    answer = await served.every_scrape("/alerts")
    [alert] = [alert for alert in answer["alerts"] if alert["capability"] == "dead"]
    assert (alert["state"], alert["failures"], alert["total"]) == ("active", worst["failed"], worst["total"])
    assert answer["config"] == config
    for index in (0, 1):  # each worker's own ledger, under the same settings, saw too few failures
        own = await own_view(served.private_dir, index, "/alerts", dict[str, Any])
        assert own["config"] == config and [a for a in own["alerts"] if a["capability"] == "dead"] == []


def test_alerts_judged_on_merged_periods_are_those_of_one_ledger_counting_every_call() -> None:
    config = AlertConfig(reach_threshold=0.9, consecutive_periods=2, min_failures=6)
    workers, whole = [ReachLedger(alert=config), ReachLedger(alert=config)], ReachLedger(alert=config)
    outcomes: dict[int, Outcome] = {10: "failed", 11: "failed", 12: "success", 14: "failed", 15: "failed"}
    for minute in range(10, 16):
        for ledger in (*workers, whole):
            ledger.evaluate(minute * 60.0)  # housekeeping closes every period in turn
        outcome = outcomes.get(minute)
        if outcome is None:
            continue
        for call in range(4):
            for ledger in (workers[call % 2], whole):
                ledger.record("echo", outcome, "TIMEOUT" if outcome == "failed" else None, 5.0, now=minute * 60.0 + 1)
    now = 16 * 60.0 + 1
    for ledger in (*workers, whole):
        ledger.evaluate(now)
    assert [ledger.alerts(now) for ledger in workers] == [[], []]
    views = [ReachView(period_seconds=60.0, periods=ledger.periods(now=now), instance_health_rate=None,
                       route_decisions={}) for ledger in workers]
    replayed = judged_alerts(merge_reach(views[0], views[1:]), config, 60, now)
    assert replayed == whole.alerts(now)
    assert [(alert.state, alert.failures, alert.fired_at) for alert in replayed] == [
        ("active", 8, 16 * 60.0), ("resolved", 8, 12 * 60.0)]
