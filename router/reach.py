"""Reach-rate accounting: did the mesh deliver each call, per capability per period, and when to alert.

raw success rate = success / total; reach rate = (success + degraded) / total, where degraded means
the call succeeded only after failover, through a fallback capability or on a demoted instance.
Instance health (healthy / registered) is a different question, answered by ``health_rate``.

The ledger has no timer of its own: a period is judged when a later ``now`` first reaches the
ledger (``record``, ``evaluate``, ``periods`` or ``alerts``), so the I/O side should call
``evaluate`` about once a second for alerts to fire on an idle capability. Any clock in seconds
works; ``time.time()`` aligns periods to wall-clock minutes and makes start/end epoch seconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from mesh.alerts import AlertConfig

Outcome = Literal["success", "degraded", "failed"]

# Upper bounds of the latency histogram's buckets (Prometheus ``le``); one more bucket holds +Inf.
LATENCY_BOUNDS_MS: tuple[float, ...] = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
UNKNOWN_ERROR = "UNKNOWN"
RESOLVED_ALERTS_KEPT = 100


class Tally(msgspec.Struct, kw_only=True):
    """One capability's calls over a span of time: a period, or the router's lifetime."""

    total: int = 0
    success: int = 0
    degraded: int = 0
    failed: int = 0
    failed_by_code: dict[str, int] = {}
    latency_buckets: list[int] = msgspec.field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    latency_sum_ms: float = 0.0

    def add(self, outcome: Outcome, error_code: str | None, latency_ms: float) -> None:
        """Count one call; ``error_code`` is read only for failed calls (None counts as UNKNOWN)."""
        if outcome == "success":
            self.success += 1
        elif outcome == "degraded":
            self.degraded += 1
        elif outcome == "failed":
            self.failed += 1
            code = error_code or UNKNOWN_ERROR
            self.failed_by_code[code] = self.failed_by_code.get(code, 0) + 1
        else:
            raise ValueError(f"Unknown outcome {outcome!r}")
        self.total += 1
        self.latency_buckets[bisect_left(LATENCY_BOUNDS_MS, latency_ms)] += 1
        self.latency_sum_ms += latency_ms


def latency_quantile(buckets: list[int], q: float) -> float | None:
    """Estimate a quantile from histogram counts as Prometheus does: linear inside the bucket.

    A quantile that falls in the +Inf bucket answers the highest finite bound.
    """
    count = sum(buckets)
    if not count:
        return None
    rank = q * count
    below = 0
    for position, upper in enumerate(LATENCY_BOUNDS_MS):
        in_bucket = buckets[position]
        if in_bucket and below + in_bucket >= rank:
            lower = LATENCY_BOUNDS_MS[position - 1] if position else 0.0
            return lower + (upper - lower) * (rank - below) / in_bucket
        below += in_bucket
    return float(LATENCY_BOUNDS_MS[-1])


class PeriodSummary(msgspec.Struct, kw_only=True):
    """One capability's period as ``GET /reach`` shows it; only periods with calls exist."""

    capability: str
    start: float
    end: float
    closed: bool
    total: int
    success: int
    degraded: int
    failed: int
    failed_by_code: dict[str, int]
    raw_success_rate: float
    reach_rate: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    latency_buckets: list[int]
    latency_sum_ms: float


class ReachView(msgspec.Struct, kw_only=True):
    """``GET /reach``: the periods with calls, newest first, and what the router knows of instances and decisions."""

    period_seconds: float
    periods: list[PeriodSummary]
    instance_health_rate: float | None
    route_decisions: dict[str, int]
    semantic: Any = None  # the semantic router's stats (router/intents.py), when it runs


class Alert(msgspec.Struct, kw_only=True):
    """A capability whose reach rate stayed below the threshold; figures cover the firing streak."""

    capability: str
    state: Literal["active", "resolved"]
    reach_rate: float
    threshold: float
    failures: int
    total: int
    periods: int
    fired_at: float  # end of the streak's last period
    resolved_at: float | None = None  # end of the first period back at or above the threshold


def reach_rate(tally: Tally) -> float:
    return (tally.success + tally.degraded) / tally.total


def absorb(into: Tally, part: Tally | PeriodSummary) -> Tally:
    """Add ``part``'s counts, error codes and latency histogram to ``into``."""
    into.total += part.total
    into.success += part.success
    into.degraded += part.degraded
    into.failed += part.failed
    for code, count in part.failed_by_code.items():
        into.failed_by_code[code] = into.failed_by_code.get(code, 0) + count
    into.latency_buckets = [a + b for a, b in zip(into.latency_buckets, part.latency_buckets, strict=True)]
    into.latency_sum_ms += part.latency_sum_ms
    return into


def merged(parts: Iterable[Tally | PeriodSummary]) -> Tally:
    tally = Tally()
    for part in parts:
        absorb(tally, part)
    return tally


def period_summary(capability: str, start: float, period_seconds: float, tally: Tally, closed: bool) -> PeriodSummary:
    """A period's counts as ``GET /reach`` shows them: rates and percentiles computed from the counts and buckets
    (so periods merged across routers' workers are summarised exactly as one router's)."""
    buckets = list(tally.latency_buckets)
    return PeriodSummary(
        capability=capability, start=start, end=start + period_seconds, closed=closed,
        total=tally.total, success=tally.success, degraded=tally.degraded, failed=tally.failed,
        failed_by_code=dict(tally.failed_by_code), raw_success_rate=tally.success / tally.total,
        reach_rate=reach_rate(tally), latency_p50_ms=latency_quantile(buckets, 0.5),
        latency_p95_ms=latency_quantile(buckets, 0.95), latency_p99_ms=latency_quantile(buckets, 0.99),
        latency_buckets=buckets, latency_sum_ms=tally.latency_sum_ms,
    )


def tally_of(tallies: dict[Any, Tally], key: Any) -> Tally:
    """``key``'s tally, made on its first call only (``setdefault`` would build a Tally on every call)."""
    tally = tallies.get(key)
    if tally is None:
        tally = tallies[key] = Tally()
    return tally


def health_rate(healthy: int, registered: int) -> float | None:
    """Share of registered instances that are healthy; None when nothing is registered."""
    return healthy / registered if registered else None


class ReachLedger:
    """Per-capability tallies per period, the last ``keep_periods`` of them, and the alerts they raise.

    An alert fires when ``consecutive_periods`` consecutive closed periods each have a reach rate
    below the threshold and together at least ``min_failures`` failures; it resolves at the first
    closed period at or above the threshold, or without calls. One alert per capability at a time.
    """

    def __init__(self, period_seconds: float = 60, keep_periods: int = 60, alert: AlertConfig = AlertConfig()):
        self.period_seconds = float(period_seconds)
        self.keep_periods = keep_periods
        self.alert_config = alert
        self._periods: dict[str, dict[int, Tally]] = {}
        self._lifetime: dict[str, Tally] = {}
        self._current: int | None = None
        self._active: dict[str, Alert] = {}
        self._resolved: deque[Alert] = deque(maxlen=RESOLVED_ALERTS_KEPT)
        self._new: list[Alert] = []

    def record(self, capability: str, outcome: Outcome, error_code: str | None, latency_ms: float, now: float) -> None:
        """Count one finished call; a clock older than the open period counts in the open period."""
        current = self.evaluate(now)
        periods = self._periods.get(capability)
        if periods is None:
            periods = self._periods[capability] = {}
        tally_of(periods, current).add(outcome, error_code, latency_ms)
        tally_of(self._lifetime, capability).add(outcome, error_code, latency_ms)

    def add_period(self, capability: str, start: float, tally: Tally) -> None:
        """Calls counted elsewhere (another ledger's period starting at ``start``) added to that period here, for
        the alerts they raise; the lifetime counters (this router's own, for Prometheus) are left alone."""
        current = self.evaluate(start)
        absorb(tally_of(self._periods.setdefault(capability, {}), current), tally)

    def evaluate(self, now: float) -> int:
        """Close the periods ``now`` has moved past and judge alerts on them; returns the open period."""
        index = math.floor(now / self.period_seconds)
        if self._current is None:
            self._current = index
        elif index > self._current:
            self._current = index
            self._forget_old_periods(index)
            for capability in sorted(self._periods.keys() | self._active.keys()):
                self._judge(capability, index)
        return self._current

    def periods(self, capability: str | None = None, *, now: float) -> list[PeriodSummary]:
        """The open period and the recent closed ones with calls, newest first (then by capability)."""
        current = self.evaluate(now)
        names = [capability] if capability is not None else list(self._periods)
        rows = [(index, name, tally) for name in names for index, tally in self._periods.get(name, {}).items()]
        rows.sort(key=lambda row: (-row[0], row[1]))
        return [self._summary(name, index, tally, closed=index < current) for index, name, tally in rows]

    def capabilities(self) -> list[str]:
        """Every capability that has had a call since the router started."""
        return sorted(self._lifetime)

    def lifetime(self) -> dict[str, Tally]:
        """Counters since start, for Prometheus (whose counters and histograms never reset); read only."""
        return self._lifetime

    def alerts(self, now: float) -> list[Alert]:
        """Active alerts (newest first), then recently resolved ones (newest first)."""
        self.evaluate(now)
        active = sorted(self._active.values(), key=lambda alert: (-alert.fired_at, alert.capability))
        return [*active, *self._resolved]

    def drain_new_alerts(self) -> list[Alert]:
        """Each alert transition since the last drain, once: a copy with state "active" when it fired,
        another with state "resolved" when it resolved, so the I/O side logs each as one event."""
        new, self._new = self._new, []
        return new

    def _forget_old_periods(self, current: int) -> None:
        oldest_kept = current - self.keep_periods + 1
        for name in list(self._periods):
            kept = {index: tally for index, tally in self._periods[name].items() if index >= oldest_kept}
            if kept:
                self._periods[name] = kept
            else:
                del self._periods[name]

    def _judge(self, capability: str, current: int) -> None:
        """Fire or resolve this capability's alert on the periods closed so far (those before ``current``)."""
        config = self.alert_config
        last_closed = current - 1
        periods = self._periods.get(capability, {})
        streak = [periods.get(index) for index in range(last_closed - config.consecutive_periods + 1, last_closed + 1)]
        below = [tally is not None and reach_rate(tally) < config.reach_threshold for tally in streak]
        period_end = (last_closed + 1) * self.period_seconds
        active = self._active.get(capability)
        if active is not None:
            if not below[-1]:
                active.state, active.resolved_at = "resolved", period_end
                del self._active[capability]
                self._resolved.appendleft(active)
                self._new.append(msgspec.structs.replace(active))
            return
        if not all(below):
            return
        closed = [tally for tally in streak if tally is not None]  # the whole streak: each one is below
        failures = sum(tally.failed for tally in closed)
        if failures < config.min_failures:
            return
        total = sum(tally.total for tally in closed)
        delivered = sum(tally.success + tally.degraded for tally in closed)
        alert = Alert(capability=capability, state="active", reach_rate=delivered / total,
                      threshold=config.reach_threshold, failures=failures, total=total,
                      periods=config.consecutive_periods, fired_at=period_end)
        self._active[capability] = alert
        self._new.append(msgspec.structs.replace(alert))

    def _summary(self, capability: str, index: int, tally: Tally, closed: bool) -> PeriodSummary:
        return period_summary(capability, index * self.period_seconds, self.period_seconds, tally, closed)
