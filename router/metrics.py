"""Prometheus metrics for the router, read at scrape time from the ledger and the instance book."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from router.core import Router
from router.reach import LATENCY_BOUNDS_MS


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
            cumulative, buckets = 0, []
            for bound, count in zip([*LATENCY_BOUNDS_MS, float("inf")], tally.latency_buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else str(bound / 1000), cumulative))
            latency.add_metric([capability], buckets, tally.latency_sum_ms / 1000)
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
        yield CounterMetricFamily("agentreach_router_traces_sampled_out",
                                  "Successful calls not traced: over the traced successes per second",
                                  value=router.traces.sampled_out)
