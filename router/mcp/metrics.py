"""The MCP face's gauges in the router's /metrics: sessions held, and how many keep a stream open."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.mcp.sessions import Sessions


class McpCollector(Collector):
    def __init__(self, sessions: Sessions):
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("agentreach_mcp_sessions", "MCP sessions this router holds (initialize began them)",
                                value=len(self._sessions))
        yield GaugeMetricFamily("agentreach_mcp_streams_open", "MCP sessions whose GET /mcp stream is open, each "
                                "told of changes to its caller's tools", value=self._sessions.streaming)
