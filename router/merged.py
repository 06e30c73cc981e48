"""One router's view from its `--workers N` workers' views: pure merging (router/worker_views.py fetches them).

Counters and histograms add up: every worker counts into the same buckets, so the sums are exact. A gauge adds
up only when its meaning does (router/metrics.py SUMMED_GAUGES: calls in flight, budget held); any other gauge
is one worker's state (its breakers, its view of the registry, its open period's rates) and each worker's value
is kept under a `worker` label. A reach period's counts add up, and its rates and percentiles are computed again
from the summed counts and latency buckets, exactly as for one router. Traces are listed newest first. Usage adds up
per period and name (each worker's `(other)` overflow row into one). Views come by worker index and are added in
that order, so whichever worker answers, the sums (costs are floats) are the same. Rule hits, shadow verdicts
and mirrored copies add up per rule (per mirrored version), keeping the newest disagreements of all workers.
Reach alerts are judged again on the merged periods, as one ledger holding every worker's calls would judge them
(each worker's own sees its share of the failures only). Instance scores do not add up: each worker scores from
its own measurements (decision 52), so every worker's rows are listed, labelled with its index, never averaged.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import msgspec
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from mesh.alerts import AlertConfig
from mesh.policy import ScoreWeights
from router.degradation import DegradedAlert
from router.reach import Alert, PeriodSummary, ReachLedger, ReachView, merged, period_summary
from router.rollback import ROLLBACKS_KEPT, RollbackAlert
from router.scoring import InstanceScore
from router.shadow import SAMPLES_KEPT as SHADOW_SAMPLES_KEPT
from router.shadow import RuleHits, ShadowStats
from router.traces import CallTrace, TraceNode
from router.traffic_mirror import SAMPLES_KEPT as MIRROR_SAMPLES_KEPT
from router.traffic_mirror import MirrorStats
from router.usage import PeriodUsage, Totals

LabelKey = tuple[str, tuple[tuple[str, str], ...]]


class Sample(msgspec.Struct, array_like=True, frozen=True):
    name: str
    labels: dict[str, str]
    value: float


class Family(msgspec.Struct, frozen=True):
    """One metric family as a worker collected it, to cross to a sibling."""

    name: str
    kind: str
    documentation: str
    samples: list[Sample]


class TraceAnswer(msgspec.Struct, kw_only=True):
    """``GET /traces/{request_id}``: the newest call with that id and the tree it belongs to."""

    call: CallTrace
    tree: TraceNode | None


class RuleStats(msgspec.Struct, kw_only=True):
    """``GET /rules/stats``: calls each live rule decided, each shadow rule's and each mirror's record."""

    hits: list[RuleHits]
    shadow: list[ShadowStats]
    mirror: list[MirrorStats]


class Recorded(Protocol):
    """A record with counts and its latest samples (each with ``at``, unix seconds)."""

    samples: list[Any]


Row = TypeVar("Row", bound=Recorded)


class AlertsAnswer(msgspec.Struct, kw_only=True):
    """``GET /alerts``: reach alerts with their settings, canary rollbacks this router made, degraded answers."""

    alerts: list[Alert]
    config: AlertConfig
    rollbacks: list[RollbackAlert]
    degraded: list[DegradedAlert]


class WorkerScore(InstanceScore, kw_only=True, frozen=True):
    """An instance as one of `--workers N` scores it."""

    worker: int


class Scores(msgspec.Struct, kw_only=True):
    """``GET /scores/{capability}``: the policy in force and every instance's score (with workers, each worker's)."""

    capability: str
    policy: str
    weights: ScoreWeights
    explore_share: float
    quality_floor: float | None
    instances: list[InstanceScore]


def families(collector: Collector) -> list[Family]:
    return [Family(metric.name, metric.type, metric.documentation,
                   [Sample(sample.name, sample.labels, sample.value) for sample in metric.samples])
            for metric in collector.collect()]


def merge_metrics(views: Mapping[int, list[Family]], summed_gauges: frozenset[str]) -> list[Metric]:
    """Every worker's families (by worker index) as one router's: in the order first seen."""
    merged_families: dict[str, tuple[Metric, dict[LabelKey, tuple[dict[str, str], float]]]] = {}
    for worker in sorted(views):
        for family in views[worker]:
            metric, values = merged_families.setdefault(
                family.name, (Metric(family.name, family.documentation, family.kind), {}))
            per_worker = family.kind == "gauge" and family.name not in summed_gauges
            for sample in family.samples:
                labels = {**sample.labels, "worker": str(worker)} if per_worker else sample.labels
                key = (sample.name, tuple(sorted(labels.items())))
                _, total = values.get(key, (labels, 0.0))
                values[key] = (labels, total + sample.value)
    for metric, values in merged_families.values():
        for (name, _), (labels, value) in values.items():
            metric.add_sample(name, labels, value)
    return [metric for metric, _ in merged_families.values()]


def merge_reach(own: ReachView, others: Iterable[ReachView]) -> ReachView:
    """``own`` (the answering worker's) with every worker's periods and route decisions added up; the instance
    health rate and the semantic router's stats stay its own (every worker follows the same registry)."""
    views = [own, *others]
    groups: dict[tuple[str, float], list[PeriodSummary]] = {}
    for view in views:
        for period in view.periods:
            groups.setdefault((period.capability, period.start), []).append(period)
    periods = [period_summary(capability, start, own.period_seconds, merged(group),
                              closed=all(period.closed for period in group))
               for (capability, start), group in groups.items()]
    periods.sort(key=lambda period: (-period.start, period.capability))
    decisions: dict[str, int] = {}
    for view in views:
        for kind, count in view.route_decisions.items():
            decisions[kind] = decisions.get(kind, 0) + count
    return msgspec.structs.replace(own, periods=periods, route_decisions=decisions)


def merge_traces(views: Iterable[list[CallTrace]], limit: int) -> list[CallTrace]:
    """The ``limit`` newest calls of all the workers' recent ones, newest first."""
    return sorted((call for view in views for call in view), key=lambda call: -call.started_at)[:limit]


def newest_trace(answers: Iterable[TraceAnswer | None]) -> TraceAnswer | None:
    """The newest call with the id among the workers that kept one (a caller may reuse a request id)."""
    return max((answer for answer in answers if answer is not None), key=lambda answer: answer.call.started_at,
               default=None)


def _absorb(into: dict[str, Totals], part: dict[str, Totals]) -> None:
    for name, used in part.items():
        into.setdefault(name, Totals()).absorb(used)


def merge_usage(views: Mapping[int, list[PeriodUsage]]) -> list[PeriodUsage]:
    """Every worker's usage periods added up, per period and per client, capability and instance; oldest first."""
    whole: dict[int, PeriodUsage] = {}
    for worker in sorted(views):
        for period in views[worker]:
            into = whole.get(period.start)
            if into is None:
                into = whole[period.start] = PeriodUsage(start=period.start, end=period.end, total=Totals(),
                                                         by_client={}, by_capability={}, by_instance={})
            into.total.absorb(period.total)
            _absorb(into.by_client, period.by_client)
            _absorb(into.by_capability, period.by_capability)
            _absorb(into.by_instance, period.by_instance)
    return [whole[start] for start in sorted(whole)]


def _taken_at(sample: Any) -> float:
    return float(sample.at)


def _sum_rows(views: Mapping[int, list[Row]], key: Callable[[Row], Any], counts: tuple[str, ...],
              kept: int) -> list[Row]:
    """Rows with the same key as one: their ``counts`` added up, the newest ``kept`` of their samples."""
    whole: dict[Any, Row] = {}
    for worker in sorted(views):
        for row in views[worker]:
            into = whole.get(key(row))
            if into is None:  # a copy: the answering worker's own rows are its live records
                into = whole[key(row)] = copy.copy(row)
                into.samples = list(row.samples)
                continue
            for name in counts:
                setattr(into, name, getattr(into, name) + getattr(row, name))
            into.samples = sorted([*into.samples, *row.samples], key=_taken_at)[-kept:]
    return [whole[name] for name in sorted(whole)]


def merge_rule_stats(views: Mapping[int, RuleStats]) -> RuleStats:
    hits: dict[tuple[str, str], int] = {}
    for worker in sorted(views):
        for hit in views[worker].hits:
            hits[(hit.capability, hit.rule)] = hits.get((hit.capability, hit.rule), 0) + hit.calls
    return RuleStats(
        hits=[RuleHits(capability=capability, rule=rule, calls=calls)
              for (capability, rule), calls in sorted(hits.items())],
        shadow=_sum_rows({worker: view.shadow for worker, view in views.items()},
                         lambda row: (row.capability, row.rule), ("agree", "disagree"), SHADOW_SAMPLES_KEPT),
        mirror=_sum_rows({worker: view.mirror for worker, view in views.items()},
                         lambda row: (row.capability, row.version),
                         ("sent", "skipped", "same_status", "different_status", "live_ms_sum", "mirror_ms_sum"),
                         MIRROR_SAMPLES_KEPT))


def label_scores(views: Mapping[int, list[InstanceScore]]) -> list[InstanceScore]:
    """Every worker's instance scores, by worker, each worker's best first."""
    return [WorkerScore(worker=worker, **msgspec.structs.asdict(score)) for worker in sorted(views)
            for score in views[worker]]


def judged_alerts(whole: ReachView, config: AlertConfig, keep_periods: int, now: float) -> list[Alert]:
    """The alerts of one ledger that counted every worker's calls: the merged periods replayed oldest first, each
    period closed and judged in turn (as the router's housekeeping does every second). Only the kept periods are
    known: an alert resolved before them is not listed, and one firing since before them dates from their start."""
    ledger = ReachLedger(whole.period_seconds, keep_periods, config)
    by_index: dict[int, list[PeriodSummary]] = {}
    for period in whole.periods:
        by_index.setdefault(round(period.start / whole.period_seconds), []).append(period)
    if not by_index:
        return []
    for index in range(min(by_index), math.floor(now / whole.period_seconds) + 1):
        ledger.evaluate((index + 0.5) * whole.period_seconds)
        for period in by_index.get(index, []):
            ledger.add_period(period.capability, period.start, merged([period]))
    return ledger.alerts(now)


def merge_alerts(views: Mapping[int, AlertsAnswer], whole: ReachView, own: int, keep_periods: int,
                 now: float) -> AlertsAnswer:
    """Reach alerts judged on ``whole`` (the merged reach view) under worker ``own``'s settings; every worker's
    rollbacks newest first; degraded answers added up per capability."""
    rollbacks = sorted((rollback for worker in sorted(views) for rollback in views[worker].rollbacks),
                       key=lambda rollback: -rollback.at)[:ROLLBACKS_KEPT]
    degraded: dict[str, DegradedAlert] = {}
    for worker in sorted(views):
        for alert in views[worker].degraded:
            into = degraded.get(alert.capability)
            if into is None:
                degraded[alert.capability] = msgspec.structs.replace(alert)
                continue
            into.answers += alert.answers
            into.first_at = min(into.first_at, alert.first_at)
            if alert.last_at > into.last_at:
                into.last_at, into.last_reason = alert.last_at, alert.last_reason
    config = views[own].config
    return AlertsAnswer(alerts=judged_alerts(whole, config, keep_periods, now), config=config, rollbacks=rollbacks,
                        degraded=sorted(degraded.values(), key=lambda alert: -alert.last_at))
