"""The console's arithmetic over router periods and traces: merged rates, percentiles, counters
that survive a router restart, per-agent traffic and the heartbeat history."""

from __future__ import annotations

from agent_reach.usage import Usage

from console.heartbeats import HeartbeatLog
from console.rollup import capability_reach, counter_deltas, period_totals, reach_points, recent
from console.traffic import QPS_SECONDS, WINDOW_SECONDS, TrafficWindow, samples_of
from registry.views import AgentView
from router.reach import PeriodSummary, ReachLedger, Tally, merged
from router.traces import AttemptTrace, CallTrace


def ledger_periods(calls: list[tuple[str, str, float, float]]) -> list[PeriodSummary]:
    """Periods exactly as the router summarises them: (capability, outcome, latency_ms, at)."""
    ledger = ReachLedger(period_seconds=60)
    for capability, outcome, latency_ms, at in calls:
        ledger.record(capability, outcome, "AGENT_ERROR" if outcome == "failed" else None, latency_ms, at)
    return ledger.periods(now=max(at for *_, at in calls))


def test_points_merge_capabilities_per_period_oldest_first():
    periods = ledger_periods([("a", "success", 10, 0), ("b", "failed", 900, 1), ("a", "degraded", 20, 61),
                              ("b", "success", 30, 62), ("b", "success", 30, 63), ("a", "failed", 5, 64)])
    first, second = reach_points(periods)
    assert (first.start, first.total, first.success, first.failed) == (0, 2, 1, 1)
    assert (first.reach_rate, first.raw_success_rate) == (0.5, 0.5)
    assert (second.start, second.total, second.degraded, second.reach_rate) == (60, 4, 1, 0.75)
    assert second.raw_success_rate == 0.5
    assert first.latency_p99_ms > 500 > second.latency_p99_ms


def test_recent_takes_the_periods_overlapping_the_window():
    periods = ledger_periods([("a", "failed", 1, 0), ("a", "success", 1, 400), ("a", "success", 1, 401)])
    tally = recent(periods, now=420, seconds=300)
    assert (tally.total, tally.success) == (2, 2)


def test_capability_reach_names_alerting_capabilities_even_without_calls():
    periods = ledger_periods([("a", "success", 10, 0), ("a", "failed", 10, 61)])
    rows = capability_reach(periods, {"quiet"})
    assert [(r.capability, r.total, r.reach_rate, r.alert) for r in rows] == \
        [("a", 2, 0.5, None), ("quiet", 0, None, "active")]
    assert rows[0].failed_by_code == {"AGENT_ERROR": 1}


def test_counters_count_increments_and_a_reset_counts_whole():
    assert counter_deltas({"hash": 5, "failover": 2}, {"hash": 7, "failover": 2, "fallback": 1}) == \
        {"hash": 2, "fallback": 1}
    assert counter_deltas({"hash": 50}, {"hash": 3}) == {"hash": 3}
    periods = ledger_periods([("a", "success", 1, 0), ("a", "success", 1, 1)])
    assert sum(counter_deltas({("a", 0.0): 1}, period_totals(periods)).values()) == 1


def test_merged_tallies_add_histograms():
    one, two = Tally(), Tally()
    one.add("success", None, 3)
    two.add("failed", "BUSY", 3000)
    total = merged([one, two])
    assert (total.total, total.failed_by_code, sum(total.latency_buckets)) == (2, {"BUSY": 1}, 2)


def trace(request_id: str, at: float, attempts: list[tuple[str, float, str | None]], outcome: str,
          tokens: int | None = None, capability: str = "cap") -> CallTrace:
    return CallTrace(request_id=request_id, capability=capability, trace_id=request_id, started_at=at,
                     outcome=outcome,
                     usage=None if tokens is None else Usage(input_tokens=1, output_tokens=tokens - 1),
                     attempts=[AttemptTrace(instance=agent, endpoint="http://x", protocol="rest", started_ms=i * 10.0,
                                            elapsed_ms=elapsed, error_code=code)
                               for i, (agent, elapsed, code) in enumerate(attempts)])


def test_tokens_belong_to_the_instance_that_answered():
    call = trace("r1", 100, [("a1", 5000, "FIRST_BYTE_TIMEOUT"), ("a2", 40, None)], "degraded", tokens=12)
    samples = samples_of(call)
    assert [(s.agent_id, s.tokens, s.error_code) for s in samples] == \
        [("a1", 0, "FIRST_BYTE_TIMEOUT"), ("a2", 12, None)]
    assert samples[1].at == 100.01
    assert all(s.tokens == 0 for s in samples_of(trace("r2", 100, [("a1", 5, "AGENT_ERROR")], "failed", tokens=3)))


def test_traffic_window_gives_qps_percentiles_tokens_and_errors_per_agent():
    window = TrafficWindow()
    now = 1000.0
    for i in range(30):
        window.add(samples_of(trace(f"ok{i}", now - 10, [("a1", 20 + i, None)], "success", tokens=2)))
    window.add(samples_of(trace("bad", now - 5, [("a1", 9000, "TOTAL_TIMEOUT")], "failed")))
    window.add(samples_of(trace("old", now - QPS_SECONDS - 1, [("a2", 5, None)], "success", capability="other")))
    stats = window.by_agent(now)
    a1 = stats["a1"]
    assert (a1.calls, a1.errors, a1.errors_by_code, a1.tokens) == (31, 1, {"TOTAL_TIMEOUT": 1}, 60)
    assert a1.qps == round(31 / QPS_SECONDS, 3)
    assert a1.latency_p95_ms < a1.latency_p99_ms
    assert (stats["a2"].calls, stats["a2"].qps) == (1, 0.0)
    assert set(window.by_capability("a2", now)) == {"other"}
    assert window.by_agent(now + WINDOW_SECONDS) == {}


def agent_view(agent_id: str, state: str, ms_ago: int | None, load: float = 0.1) -> AgentView:
    return AgentView(agent_id=agent_id, service="s", state=state, capabilities=[], metadata={}, health_url="http://h",
                     base_url=None, direct_fallback=False, registered_at=0.0, evicted_at=None, load=load, inflight=0,
                     health=None, metrics=None, failed_checks=0, last_heartbeat_ms_ago=ms_ago)


def test_heartbeat_log_notices_new_beats_and_state_changes_and_forgets_leavers():
    log = HeartbeatLog()
    log.observe([agent_view("a", "pending", None)], 100.0)
    log.observe([agent_view("a", "healthy", 200)], 101.0)    # beat at 100.8
    log.observe([agent_view("a", "healthy", 1210)], 102.01)  # the same beat, read again
    log.observe([agent_view("a", "healthy", 100, 0.5)], 103.0)  # a new one at 102.9
    log.observe([agent_view("a", "demoted", 9000)], 111.9)
    assert [(b.at, b.load) for b in log.beats("a")] == [(100.8, 0.1), (102.9, 0.5)]
    assert [(t.previous, t.state) for t in log.transitions("a")] == [(None, "pending"), ("pending", "healthy"),
                                                                     ("healthy", "demoted")]
    log.observe([], 112.0)
    assert log.beats("a") == [] and log.transitions("a") == []
