"""The console's SQLite hours: each closed period folded once, attempts and decisions added up,
everything still there after the console reopens its store."""

from __future__ import annotations

from console.store import HOUR, KEEP_HOURS, ConsoleStore
from console.traffic import Sample
from router.reach import ReachLedger


def periods(ledger: ReachLedger, now: float):
    return ledger.periods(now=now)


async def test_closed_periods_are_folded_into_hours_once_and_survive_reopening(tmp_path):
    ledger = ReachLedger(period_seconds=60)
    base = 10 * HOUR

    def record(at: float, outcome: str) -> None:
        ledger.record("cap", outcome, "AGENT_ERROR" if outcome == "failed" else None, 12.0, at)

    store = ConsoleStore(tmp_path / "console.db")
    await store.open()
    record(base + 1, "success")
    record(base + 2, "failed")
    record(base + 61, "degraded")
    assert await store.fold_periods(periods(ledger, base + 70)) == 1  # the second period is still open
    assert await store.fold_periods(periods(ledger, base + 70)) == 0
    assert await store.fold_periods(periods(ledger, base + 130)) == 1
    await store.close()

    reopened = ConsoleStore(tmp_path / "console.db")
    await reopened.open()
    assert await reopened.fold_periods(periods(ledger, base + 130)) == 0
    [hour] = await reopened.reach_hours(since=base)
    assert (hour.hour, hour.total, hour.success, hour.degraded, hour.failed) == (base, 3, 1, 1, 1)
    assert hour.reach_rate == 2 / 3 and hour.latency_p95_ms is not None
    record(base + HOUR + 5, "success")
    await reopened.fold_periods(periods(ledger, base + HOUR + 61))
    assert [(h.hour, h.total) for h in await reopened.reach_hours(since=base)] == [(base, 3), (base + HOUR, 1)]
    await reopened.close()


async def test_agent_attempts_and_route_decisions_add_up_per_hour(tmp_path):
    store = ConsoleStore(tmp_path / "console.db")
    await store.open()
    at = 20 * HOUR + 5
    await store.add_samples([Sample(at, "a1", "cap", 10.0, None, 3), Sample(at, "a1", "cap", 2000.0, "BUSY", 0),
                             Sample(at, "a2", "cap", 10.0, None, 0)], watermark=at)
    await store.add_samples([Sample(at + 1, "a1", "other", 30.0, None, 4)], watermark=at + 1)
    [hour] = await store.agent_hours("a1", since=at - HOUR)
    assert (hour.total, hour.failed, hour.tokens) == (3, 1, 7)
    assert await store.get_meta("traces_watermark") == at + 1
    await store.add_decisions({"hash": 2}, {"hash": 2}, now=at)
    await store.add_decisions({"hash": 1, "failover": 1}, {"hash": 3, "failover": 1}, now=at + 10)
    [decisions] = await store.decision_hours(since=at - HOUR)
    assert decisions.decisions == {"hash": 3, "failover": 1} and decisions.total == 4
    assert await store.get_meta("decision_counters") == {"hash": 3, "failover": 1}
    await store.prune(now=at + (KEEP_HOURS + 1) * HOUR)
    assert await store.agent_hours("a1", since=0) == [] and await store.decision_hours(since=0) == []
    await store.close()
