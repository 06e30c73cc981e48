"""Reach-rate accounting per capability per period, latency estimates, and reach alerts."""

import msgspec
import pytest

from router.reach import (
    LATENCY_BOUNDS_MS,
    Alert,
    AlertConfig,
    ReachLedger,
    health_rate,
    latency_quantile,
)

CAP = "intent.detect"


def record_mix(ledger: ReachLedger, now: float, success: int = 0, degraded: int = 0, failed: int = 0,
               capability: str = CAP, code: str = "AGENT_ERROR") -> None:
    for _ in range(success):
        ledger.record(capability, "success", None, 20.0, now)
    for _ in range(degraded):
        ledger.record(capability, "degraded", None, 200.0, now)
    for _ in range(failed):
        ledger.record(capability, "failed", code, 2000.0, now)


def test_a_period_counts_outcomes_and_failures_by_code():
    ledger = ReachLedger()
    record_mix(ledger, 60.0, success=90, degraded=5)
    record_mix(ledger, 61.0, failed=3, code="TOTAL_TIMEOUT")
    ledger.record(CAP, "failed", None, 1.0, 62.0)
    ledger.record(CAP, "failed", "BUSY", 1.0, 62.0)
    [period] = ledger.periods(now=63.0)
    assert (period.capability, period.start, period.end, period.closed) == (CAP, 60.0, 120.0, False)
    assert (period.total, period.success, period.degraded, period.failed) == (100, 90, 5, 5)
    assert period.failed_by_code == {"TOTAL_TIMEOUT": 3, "UNKNOWN": 1, "BUSY": 1}
    assert period.raw_success_rate == 0.9
    assert period.reach_rate == 0.95


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="Unknown outcome"):
        ReachLedger().record(CAP, "ok", None, 1.0, 0.0)


def test_latency_histogram_uses_inclusive_upper_bounds():
    ledger = ReachLedger()
    for latency in (5.0, 5.1, 100.0, 70_000.0):
        ledger.record(CAP, "success", None, latency, 0.0)
    [period] = ledger.periods(now=0.0)
    expected = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    expected[0] = expected[1] = expected[4] = expected[-1] = 1
    assert period.latency_buckets == expected
    assert period.latency_sum_ms == 70_110.1


def test_quantiles_interpolate_inside_the_bucket():
    buckets = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    buckets[2] = 100  # 100 calls between 10 and 25 ms
    assert latency_quantile(buckets, 0.5) == 17.5
    assert latency_quantile(buckets, 0.99) == pytest.approx(24.85)
    buckets[-1] = 100  # and 100 beyond the last bound
    assert latency_quantile(buckets, 0.5) == 25.0
    assert latency_quantile(buckets, 0.95) == 60_000.0
    assert latency_quantile([0] * len(buckets), 0.5) is None


def test_summary_carries_quantiles():
    ledger = ReachLedger()
    record_mix(ledger, 0.0, success=50, failed=50)
    [period] = ledger.periods(now=1.0)
    assert period.latency_p50_ms == 25.0
    assert period.latency_p95_ms == 1000 + 1500 * 45 / 50
    assert period.latency_p99_ms == 1000 + 1500 * 49 / 50


def test_periods_are_listed_newest_first_with_closed_flags():
    ledger = ReachLedger()
    record_mix(ledger, 10.0, success=1)
    record_mix(ledger, 70.0, success=2, capability="b.cap")
    record_mix(ledger, 75.0, success=3)
    rows = [(row.capability, row.start, row.closed, row.total) for row in ledger.periods(now=130.0)]
    assert rows == [("b.cap", 60.0, True, 2), (CAP, 60.0, True, 3), (CAP, 0.0, True, 1)]
    assert [row.total for row in ledger.periods("b.cap", now=130.0)] == [2]
    assert ledger.periods("never.called", now=130.0) == []
    assert ledger.capabilities() == ["b.cap", CAP]


def test_summaries_encode_to_json():
    ledger = ReachLedger()
    record_mix(ledger, 0.0, success=1)
    decoded = msgspec.json.decode(msgspec.json.encode(ledger.periods(now=0.0)))
    assert decoded[0]["reach_rate"] == 1.0 and decoded[0]["capability"] == CAP


def test_only_keep_periods_are_remembered():
    ledger = ReachLedger(period_seconds=10, keep_periods=3)
    for start in (0.0, 10.0, 20.0, 30.0):
        record_mix(ledger, start, success=1)
    assert [row.start for row in ledger.periods(now=35.0)] == [30.0, 20.0, 10.0]
    assert ledger.periods(now=60.0) == []
    assert ledger.capabilities() == [CAP]
    assert ledger.lifetime()[CAP].total == 4


def test_a_late_clock_counts_in_the_open_period():
    ledger = ReachLedger()
    record_mix(ledger, 61.0, success=1)
    record_mix(ledger, 59.0, failed=1)
    assert [(row.start, row.total) for row in ledger.periods(now=62.0)] == [(60.0, 2)]


def test_lifetime_tally_spans_periods():
    ledger = ReachLedger()
    record_mix(ledger, 0.0, success=2, failed=1)
    record_mix(ledger, 90.0, degraded=1, failed=1, code="BUSY")
    tally = ledger.lifetime()[CAP]
    assert (tally.total, tally.success, tally.degraded, tally.failed) == (5, 2, 1, 2)
    assert tally.failed_by_code == {"AGENT_ERROR": 1, "BUSY": 1}
    assert sum(tally.latency_buckets) == 5


def test_health_rate():
    assert health_rate(3, 4) == 0.75
    assert health_rate(0, 0) is None


# --- alerts -------------------------------------------------------------------------------------

def bad_minute(ledger: ReachLedger, start: float, failed: int = 30) -> None:
    record_mix(ledger, start, success=100, failed=failed)


def test_alert_fires_after_two_bad_closed_periods_with_enough_failures():
    ledger = ReachLedger()
    bad_minute(ledger, 0.0)
    bad_minute(ledger, 60.0)
    assert ledger.alerts(now=119.0) == []
    [alert] = ledger.alerts(now=120.0)
    assert alert == Alert(capability=CAP, state="active", reach_rate=200 / 260, threshold=0.98, failures=60,
                          total=260, periods=2, fired_at=120.0)
    assert ledger.drain_new_alerts() == [alert]
    assert ledger.drain_new_alerts() == []


def test_one_bad_period_is_not_enough():
    ledger = ReachLedger()
    record_mix(ledger, 0.0, success=1000)
    bad_minute(ledger, 60.0, failed=200)
    assert ledger.alerts(now=120.0) == []


def test_too_few_failures_do_not_alert():
    ledger = ReachLedger()
    bad_minute(ledger, 0.0, failed=24)
    bad_minute(ledger, 60.0, failed=25)
    assert ledger.alerts(now=120.0) == []
    assert ledger.drain_new_alerts() == []


def test_periods_must_be_consecutive():
    ledger = ReachLedger()
    bad_minute(ledger, 0.0)
    bad_minute(ledger, 120.0)
    assert ledger.alerts(now=180.0) == []


def test_reach_at_the_threshold_is_not_below_it():
    ledger = ReachLedger(alert=AlertConfig(reach_threshold=0.5, consecutive_periods=1, min_failures=1))
    record_mix(ledger, 0.0, degraded=1, failed=1)
    assert ledger.alerts(now=60.0) == []


def test_the_open_period_never_counts():
    ledger = ReachLedger(alert=AlertConfig(consecutive_periods=1, min_failures=1))
    record_mix(ledger, 0.0, failed=100)
    assert ledger.alerts(now=59.9) == []
    assert [alert.state for alert in ledger.alerts(now=60.0)] == ["active"]


def test_an_idle_ledger_judges_when_evaluated():
    ledger = ReachLedger(alert=AlertConfig(consecutive_periods=1, min_failures=1))
    record_mix(ledger, 0.0, failed=5)
    ledger.evaluate(61.0)
    [event] = ledger.drain_new_alerts()
    assert (event.capability, event.state, event.fired_at) == (CAP, "active", 60.0)


def test_alert_stays_active_while_bad_and_resolves_on_a_good_period():
    ledger = ReachLedger()
    bad_minute(ledger, 0.0)
    bad_minute(ledger, 60.0)
    record_mix(ledger, 120.0, success=10, failed=1)
    ledger.evaluate(180.0)
    assert [alert.state for alert in ledger.alerts(now=180.0)] == ["active"]
    record_mix(ledger, 180.0, success=100)
    [resolved] = ledger.alerts(now=240.0)
    assert (resolved.state, resolved.fired_at, resolved.resolved_at) == ("resolved", 120.0, 240.0)
    assert [(event.state, event.resolved_at) for event in ledger.drain_new_alerts()] == [
        ("active", None), ("resolved", 240.0)]


def test_a_period_without_calls_resolves_the_alert():
    ledger = ReachLedger(alert=AlertConfig(consecutive_periods=1, min_failures=1))
    record_mix(ledger, 0.0, failed=5)
    ledger.evaluate(60.0)
    [alert] = ledger.alerts(now=120.0)
    assert (alert.state, alert.resolved_at) == ("resolved", 120.0)


def test_active_alerts_come_before_resolved_ones():
    ledger = ReachLedger(alert=AlertConfig(consecutive_periods=1, min_failures=1))
    record_mix(ledger, 0.0, failed=5, capability="first")
    record_mix(ledger, 60.0, success=5, capability="first")
    record_mix(ledger, 60.0, failed=5, capability="second")
    record_mix(ledger, 120.0, failed=5, capability="third")
    record_mix(ledger, 120.0, failed=5, capability="second")
    rows = [(alert.capability, alert.state, alert.fired_at) for alert in ledger.alerts(now=180.0)]
    assert rows == [("third", "active", 180.0), ("second", "active", 120.0), ("first", "resolved", 60.0)]
