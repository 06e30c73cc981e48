"""What every server's /metrics says of its connections, read at scrape time from its listener's Gate
(agent_reach.admission): how many are open against the cap, how many were refused (at the cap, or past an
address's share) or closed to make room, and how many callers left mid-request, the events its logs report
only once per interval."""

from __future__ import annotations

from collections.abc import Iterator

from agent_reach.admission import Gate
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ConnectionCollector(Collector):
    """The connection metrics of one part of the mesh (``part``: registry, router, console)."""

    def __init__(self, part: str, gate: Gate):
        self._prefix = f"agentreach_{part}_connections"
        self._part = part
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate, prefix = self._gate, self._prefix
        yield GaugeMetricFamily(f"{prefix}_open", "Connections open on this server's listener", value=gate.open)
        yield GaugeMetricFamily(f"{prefix}_limit", "The most connections the listener holds at once (its cap)",
                                value=gate.limit)
        refused = CounterMetricFamily(f"{prefix}_refused", "Connections answered 503 too_many_connections and closed "
                                      "as they were accepted: at the cap, or past their address's share",
                                      labels=["reason"])
        refused.add_metric(["cap"], gate.refused)
        refused.add_metric(["peer"], gate.refused_peer)
        yield refused
        yield CounterMetricFamily(f"{prefix}_shed", "Connections waiting on a slow client (idle, or a request still "
                                  "arriving) closed near the cap to make room for new ones", value=gate.shed)
        yield CounterMetricFamily(f"agentreach_{self._part}_caller_hangups", "Callers that left mid-request (a "
                                  "header, body or answer unfinished): nothing answered, nothing logged but one "
                                  "line per 10 s", value=gate.hang_ups)
