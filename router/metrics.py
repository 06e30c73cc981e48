"""Prometheus metrics for the router, read at scrape time from the ledger and the instance book."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from router.budgets import ASK_BOUNDS_MS, Budgets
from router.core import Router
from router.reach import LATENCY_BOUNDS_MS

if TYPE_CHECKING:
    from router.intents import SemanticRouter

# Gauges whose `--workers N` values add up to the router's (router/merged.py); every other gauge is one worker's
# state (its breakers, its view of the registry, its period's rates) and is shown per worker, labelled `worker`.
SUMMED_GAUGES = frozenset({"agentreach_router_inflight", "agentreach_router_budget_leased_unspent_tokens",
                           "agentreach_router_budget_leased_unspent_cost", "agentreach_router_connections_open",
                           "agentreach_router_connections_limit"})


def cumulative(bounds_ms: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus histogram buckets (upper bound in seconds, cumulative count) from counts per bucket."""
    total = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip([*bounds_ms, float("inf")], counts, strict=True):
        total += count
        buckets.append(("+Inf" if bound == float("inf") else str(bound / 1000), total))
    return buckets


def budget_metrics(budgets: Budgets) -> Iterator[Metric]:
    """Client budgets at this router: refusals, lease asks and what its leases hold unspent (no client label:
    the label sets stay bounded however many clients have budgets)."""
    refusals = CounterMetricFamily("agentreach_router_budget_refusals", "Calls refused by budgets, by reason",
                                   labels=["reason"])
    for reason, count in sorted(budgets.refusals.items()):
        refusals.add_metric([reason], count)
    yield refusals
    asks = CounterMetricFamily("agentreach_router_budget_lease_asks", "Budget lease asks to the registry by outcome",
                               labels=["outcome"])
    for outcome, count in sorted(budgets.asks.items()):
        asks.add_metric([outcome], count)
    yield asks
    latency = HistogramMetricFamily("agentreach_router_budget_lease_ask_seconds",
                                    "Budget lease asks' latency, answered or not")
    latency.add_metric([], cumulative(ASK_BOUNDS_MS, budgets.ask_buckets), budgets.ask_seconds)
    yield latency
    yield CounterMetricFamily("agentreach_router_budget_bounds_exceeded",
                              "Budgeted calls that used more than the context.max_tokens or max_cost they declared",
                              value=budgets.bounds_exceeded)
    tokens, cost = budgets.unspent()
    yield GaugeMetricFamily("agentreach_router_budget_leased_unspent_tokens",
                            "Budget tokens this router was granted this period and has not spent", value=tokens)
    yield GaugeMetricFamily("agentreach_router_budget_leased_unspent_cost",
                            "Budget cost this router was granted this period and has not spent", value=cost)


# The mq transport's counts (router/transports/mq.py), each a counter of its own.
MQ_COUNTS = {"duplicates": "mq answers dropped: the call was answered already, by another instance",
             "redelivered": "mq calls answered after the instance holding them died (answered once)",
             "dead_lettered": "mq calls agents dead-lettered after too many deliveries"}


def mq_metrics(counts: Mapping[str, int]) -> Iterator[Metric]:
    for what, help_text in MQ_COUNTS.items():
        yield CounterMetricFamily(f"agentreach_router_mq_{what}", help_text.capitalize(), value=counts.get(what, 0))


def dropped_metrics(router: Router) -> Iterator[Metric]:
    """What best-effort records lost, shown only for the ones the router keeps: audit rows past a full buffer,
    calls whose spans could not be handed to the OTLP exporter (gone, or more than 8 MiB behind)."""
    if router.audit is not None:
        yield CounterMetricFamily("agentreach_router_audit_dropped_rows",
                                  "Audit rows dropped: the audit buffer was full", value=router.audit.dropped)
    if router.export is not None:
        yield CounterMetricFamily("agentreach_router_otlp_dropped_calls",
                                  "Calls whose spans were not exported: the OTLP exporter was gone or too far behind",
                                  value=router.export.dropped)


def semantic_metrics(semantic: SemanticRouter) -> Iterator[Metric]:
    """Each embedding model of the cascade (its name, vector size and stage) and how its answers went."""
    models = GaugeMetricFamily("agentreach_router_embedding_model", "1 per embedding model intents are matched "
                               "with, by name, vector size and stage (1: the shipped model, asked first)",
                               labels=["model", "dimensions", "stage"])
    decided = CounterMetricFamily("agentreach_router_intent_stage_decisions", "Intents each embedding model was "
                                  "asked about, by what it concluded", labels=["model", "outcome"])
    for position, stage in enumerate(semantic.stages, start=1):
        models.add_metric([stage.name, str(stage.embedder.dimensions or ""), str(position)], 1)
        for outcome, count in stage.decided.items():
            decided.add_metric([stage.name, outcome], count)
    yield models
    yield decided


class RouterCollector(Collector):
    def __init__(self, router: Router):
        self._router = router

    def collect(self) -> Iterator[Metric]:
        router = self._router
        calls = CounterMetricFamily("agentreach_router_calls", "Calls by capability and outcome",
                                    labels=["capability", "outcome"])
        failures = CounterMetricFamily("agentreach_router_failures", "Failed calls by capability and error code",
                                       labels=["capability", "error_code"])
        latency = HistogramMetricFamily("agentreach_router_call_seconds", "Call latency seen by the router",
                                        labels=["capability"])
        for capability, tally in router.ledger.lifetime().items():
            for outcome in ("success", "degraded", "failed"):
                calls.add_metric([capability, outcome], getattr(tally, outcome))
            for code, count in tally.failed_by_code.items():
                failures.add_metric([capability, code], count)
            latency.add_metric([capability], cumulative(LATENCY_BOUNDS_MS, tally.latency_buckets),
                               tally.latency_sum_ms / 1000)
        yield calls
        yield failures
        yield latency
        reach = GaugeMetricFamily("agentreach_router_reach_rate", "Reach rate of the current period",
                                  labels=["capability"])
        success = GaugeMetricFamily("agentreach_router_success_rate", "Raw success rate of the current period",
                                    labels=["capability"])
        now = time.time()
        for summary in router.ledger.periods(now=now):
            if not summary.closed:
                reach.add_metric([summary.capability], summary.reach_rate)
                success.add_metric([summary.capability], summary.raw_success_rate)
        yield reach
        yield success
        decisions = CounterMetricFamily("agentreach_router_route_decisions", "Routing decisions by kind",
                                        labels=["kind"])
        for kind, count in router.decisions.items():
            decisions.add_metric([kind], count)
        yield decisions
        breakers = GaugeMetricFamily("agentreach_router_breaker_open", "1 when a breaker is open or half-open",
                                     labels=["capability", "instance"])
        monotonic = time.monotonic()
        for (scope, name), breaker in router.book.breakers():
            capability, instance = (name, "") if not scope else (scope, name)
            breakers.add_metric([capability, instance], float(breaker.state(monotonic).value != "closed"))
        yield breakers
        attempts = CounterMetricFamily("agentreach_router_attempts", "Attempts at agents by protocol and outcome "
                                       "(ok, or the attempt's error code)", labels=["protocol", "outcome"])
        for (protocol, outcome), count in sorted(router.forwarder.attempts.items()):
            attempts.add_metric([protocol, outcome], count)
        yield attempts
        yield GaugeMetricFamily("agentreach_router_websocket_connections",
                                "WebSocket connections open to agents (one per instance endpoint in use)",
                                value=router.forwarder.socket_connections)
        yield GaugeMetricFamily("agentreach_router_grpc_channels",
                                "gRPC channels connected to agents (one per instance endpoint in use)",
                                value=router.forwarder.grpc_channels)
        yield from mq_metrics(router.forwarder.queues.counts)
        yield from dropped_metrics(router)
        inflight = GaugeMetricFamily("agentreach_router_inflight", "Calls in flight per instance", labels=["instance"])
        for agent_id, count in router.book.inflight.items():
            inflight.add_metric([agent_id], count)
        yield inflight
        alerts = GaugeMetricFamily("agentreach_router_alerts_active", "Active reach-rate alerts")
        alerts.add_metric([], sum(1 for alert in router.ledger.alerts(now) if alert.state == "active"))
        yield alerts
        yield GaugeMetricFamily("agentreach_router_registry_revision", "Registry revision the router has seen",
                                value=router.mirror.revision)
        yield GaugeMetricFamily("agentreach_router_peers", "Live routers sharing the limits, this one included",
                                value=len(router.mirror.routers))
        yield GaugeMetricFamily("agentreach_router_limit_share",
                                "Fraction of every client rate and instance max_qps this router admits",
                                value=router.mirror.limit_share)
        tokens = CounterMetricFamily("agentreach_tokens", "Tokens agents reported, by capability and direction",
                                     labels=["capability", "direction"])
        cost = CounterMetricFamily("agentreach_cost", "Cost of the calls at the serving instances' prices (unit-free)",
                                   labels=["capability"])
        for capability, used in router.usage.lifetime().items():
            tokens.add_metric([capability, "input"], used.input_tokens)
            tokens.add_metric([capability, "output"], used.output_tokens)
            cost.add_metric([capability], used.cost)
        yield tokens
        yield cost
        yield from budget_metrics(router.budgets)
        if router.confirmations is not None:
            confirmations = CounterMetricFamily("agentreach_router_confirmations",
                                                "Confirmed intents by what became of their report to the registry",
                                                labels=["outcome"])
            for outcome, count in sorted(router.confirmations.outcomes.items()):
                confirmations.add_metric([outcome], count)
            yield confirmations
            yield CounterMetricFamily("agentreach_router_confirmation_retries",
                                      "Further tries of confirmations the registry did not take at first",
                                      value=router.confirmations.retries)
        if router.semantic is not None:
            yield from semantic_metrics(router.semantic)
        yield CounterMetricFamily("agentreach_router_traces_sampled_out",
                                  "Successful calls not traced: over the traced successes per second",
                                  value=router.traces.sampled_out)
