"""Prometheus metrics for the console, read from its live state at scrape time (as the registry's
are): whether it can read the mesh, how many polls it made, who is watching."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from agent_reach.admission import Gate
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from console.collector import Collector as Poller
from console.hub import Hub
from weblayer.connection_metrics import ConnectionCollector


class ConsoleCollector(Collector):
    def __init__(self, poller: Poller, hub: Hub, sessions: Callable[[], int]):
        self._poller = poller
        self._hub = hub
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        poller = self._poller
        up = GaugeMetricFamily("agentreach_console_upstream_up",
                               "1 when the console's last poll of this part of the mesh succeeded", labels=["part"])
        for part, status in poller.statuses().items():
            up.add_metric([part], int(status.ok))
        yield up
        yield CounterMetricFamily("agentreach_console_polls", "Polls of the registry and router", value=poller.polls)
        yield GaugeMetricFamily("agentreach_console_live_streams", "Browsers following the live event stream",
                                value=self._hub.subscribers)
        yield GaugeMetricFamily("agentreach_console_sessions", "Signed-in browser sessions", value=self._sessions())


def render(poller: Poller, hub: Hub, sessions: Callable[[], int], connections: Gate) -> bytes:
    prometheus = CollectorRegistry(auto_describe=False)
    prometheus.register(ConsoleCollector(poller, hub, sessions))
    prometheus.register(ConnectionCollector("console", connections))
    return generate_latest(prometheus)
