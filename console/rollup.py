"""Pure arithmetic over the router's reach periods: merge, rate, count what is new.

Counts are the router's own ``Tally`` so a period, an hour and a capability's last hour all merge
the same way, and latency percentiles come from merged histogram buckets exactly as ``/reach``
computes them for one period.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from console.models import CapabilityReach, ReachPoint
from router.reach import PeriodSummary, Tally, absorb, latency_quantile, merged

PeriodKey = tuple[str, float]
K = TypeVar("K")


def reach_of(tally: Tally) -> float | None:
    return (tally.success + tally.degraded) / tally.total if tally.total else None


def raw_success_of(tally: Tally) -> float | None:
    return tally.success / tally.total if tally.total else None


def quantile(tally: Tally, q: float) -> float | None:
    return latency_quantile(tally.latency_buckets, q)


def reach_points(periods: Iterable[PeriodSummary]) -> list[ReachPoint]:
    """One point per period start, every capability merged, oldest first (the order a chart draws)."""
    by_start: dict[float, list[PeriodSummary]] = {}
    for period in periods:
        by_start.setdefault(period.start, []).append(period)
    points = []
    for start in sorted(by_start):
        group = by_start[start]
        tally = merged(group)
        points.append(ReachPoint(
            start=start, end=group[0].end, total=tally.total, success=tally.success, degraded=tally.degraded,
            failed=tally.failed, raw_success_rate=raw_success_of(tally), reach_rate=reach_of(tally),
            latency_p50_ms=quantile(tally, 0.5), latency_p95_ms=quantile(tally, 0.95),
            latency_p99_ms=quantile(tally, 0.99)))
    return points


def recent(periods: Iterable[PeriodSummary], now: float, seconds: float) -> Tally:
    """Every call in periods that overlap the last ``seconds`` (the open period included)."""
    return merged(period for period in periods if period.end > now - seconds)


def capability_reach(periods: Iterable[PeriodSummary], active_alerts: set[str]) -> list[CapabilityReach]:
    """Each capability's calls over every period held, with whether it is alerting; by name."""
    by_name: dict[str, Tally] = {}
    for period in periods:
        absorb(by_name.setdefault(period.capability, Tally()), period)
    for name in active_alerts:
        by_name.setdefault(name, Tally())
    return [CapabilityReach(
        capability=name, total=tally.total, success=tally.success, degraded=tally.degraded, failed=tally.failed,
        failed_by_code=tally.failed_by_code, raw_success_rate=raw_success_of(tally), reach_rate=reach_of(tally),
        latency_p95_ms=quantile(tally, 0.95), latency_p99_ms=quantile(tally, 0.99),
        alert="active" if name in active_alerts else None) for name, tally in sorted(by_name.items())]


def period_totals(periods: Iterable[PeriodSummary]) -> dict[PeriodKey, int]:
    return {(period.capability, period.start): period.total for period in periods}


def counter_deltas(previous: dict[K, int], current: dict[K, int]) -> dict[K, int]:
    """Increments of monotonic counters (route decisions, a period's calls) since the previous poll.
    A counter first seen counts whole; one that went down was reset (the router restarted), so its
    new value is all new."""
    deltas = {}
    for name, value in current.items():
        before = previous.get(name, 0)
        delta = value - before if value >= before else value
        if delta:
            deltas[name] = delta
    return deltas
