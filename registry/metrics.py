"""Prometheus metrics for the registry, read from live state at scrape time (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Iterator

from agent_reach.admission import Gate as ConnectionGate
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from registry.cluster import Membership
from registry.etcd_cluster import EtcdMembership
from registry.etcd_store import EtcdStore
from registry.health import HealthChecker
from registry.lifecycle import Status
from registry.service import Registry
from registry.store import WalStore
from weblayer.connection_metrics import ConnectionCollector


class RegistryCollector(Collector):
    def __init__(self, registry: Registry, checker: HealthChecker | None, membership: Membership | None):
        self._registry = registry
        self._checker = checker
        self._membership = membership

    def collect(self) -> Iterator[Metric]:
        registry = self._registry
        grouped = registry.records_by_status(registry.clock())
        instances = GaugeMetricFamily("agentreach_registry_instances", "Registered instances by state",
                                      labels=["state"])
        for status in Status:
            instances.add_metric([status.value], len(grouped[status]))
        yield instances
        yield GaugeMetricFamily("agentreach_registry_capabilities", "Capability names with a live holder",
                                value=len({c.name for records in grouped.values() for r in records
                                           for c in r.capabilities}))
        counters = registry.counters
        for name, value, text in (
            ("registrations", counters.registrations, "Registrations acknowledged"),
            ("deregistrations", counters.deregistrations, "Deregistrations acknowledged"),
            ("heartbeats", counters.heartbeats, "Heartbeats accepted"),
            ("evictions", counters.evictions, "Instances evicted after failed health checks"),
        ):
            yield CounterMetricFamily(f"agentreach_registry_{name}", text, value=value)
        if self._checker is not None:
            checks = CounterMetricFamily("agentreach_registry_health_checks", "Active health checks",
                                         labels=["result"])
            for result, count in self._checker.checks.items():
                checks.add_metric([result], count)
            yield checks
            yield GaugeMetricFamily(
                "agentreach_registry_eviction_guard_active",
                "1 while evictions are paused because most instances went silent at once",
                value=int(self._checker.guard_active))
        yield GaugeMetricFamily("agentreach_registry_quality_alerts_active",
                                "Live instances scored below their capability's quality floor (GET /quality)",
                                value=len(registry.quality.alerts()))
        accounts, exhausted = registry.budgets.tally()
        yield GaugeMetricFamily("agentreach_registry_budget_accounts",
                                "Clients with a budget, each with an account for its current period", value=accounts)
        yield GaugeMetricFamily("agentreach_registry_budget_accounts_exhausted",
                                "Budget accounts with nothing left to lease this period", value=exhausted)
        yield GaugeMetricFamily("agentreach_registry_storage_available",
                                "1 while the store takes writes; 0 while it refuses them (full or read-only disk)",
                                value=int(registry.store.health.writable))
        yield from self._cluster()
        if isinstance(registry.store, EtcdStore) and registry.store.watch_lag is not None:
            yield GaugeMetricFamily("agentreach_etcd_watch_lag_seconds", "Between etcd committing this node's "
                                    "last write and its watch delivering it", value=registry.store.watch_lag)
        if isinstance(registry.store, WalStore):
            stats = registry.store.wal.stats
            yield CounterMetricFamily("agentreach_registry_storage_outages",
                                      "Times the WAL began refusing writes since start", value=stats.outages)
            yield CounterMetricFamily("agentreach_wal_records", "Records appended to the WAL", value=stats.records)
            yield CounterMetricFamily("agentreach_wal_syncs", "fdatasync calls (one per group-committed batch)",
                                      value=stats.syncs)
            yield GaugeMetricFamily("agentreach_wal_revision", "Last committed WAL index",
                                    value=registry.store.revision)


    def _cluster(self) -> Iterator[Metric]:
        membership = self._membership
        if membership is None:
            return
        yield GaugeMetricFamily("agentreach_registry_leader", "1 while this node leads (sweeps and evicts)",
                                value=int(membership.leads()))
        stale = membership.stale_seconds()
        yield GaugeMetricFamily("agentreach_registry_view_stale_seconds", "Seconds since this node's view was last "
                                "known current (0 while it is)", value=stale or 0.0)
        if isinstance(membership, EtcdMembership):
            yield GaugeMetricFamily("agentreach_registry_nodes", "Registry nodes whose lease holds",
                                    value=len(membership.nodes))
            yield CounterMetricFamily("agentreach_registry_terms_won", "Times this node was elected leader",
                                      value=membership.terms_won)
            if membership.etcd_rtt is not None:
                yield GaugeMetricFamily("agentreach_etcd_rtt_seconds", "Round trip of this node's last answered "
                                        "etcd request (the cluster poll)", value=membership.etcd_rtt)


def metrics_registry(registry: Registry, checker: HealthChecker | None, membership: Membership | None = None,
                     connections: ConnectionGate | None = None) -> CollectorRegistry:
    prometheus = CollectorRegistry(auto_describe=False)
    prometheus.register(RegistryCollector(registry, checker, membership))
    if connections is not None:
        prometheus.register(ConnectionCollector("registry", connections))
    return prometheus


def render(prometheus: CollectorRegistry) -> bytes:
    return generate_latest(prometheus)
