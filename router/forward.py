"""Moving one call's bytes to one agent instance: the transport of the instance's protocol does it
(router/transports/), within the call's connect / first-byte / idle / total timeouts.

The router decides; transports only send and classify what came back, so every failure becomes an
ErrorCode and a flag saying whether the agent could have seen the request.
"""

from __future__ import annotations

from collections import Counter

import aiohttp
from agent_reach.atp import RequestFrame
from agent_reach.registration import Protocol

from mesh.egress import Egress
from router.a2a.outbound import A2AAgents
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.a2a import A2ADialect
from router.transports.answer import AgentAnswer
from router.transports.atp import AtpDialect
from router.transports.base import DEFAULT_MAX_ANSWER_BYTES, Transport
from router.transports.grpc import GrpcTransport
from router.transports.http import HttpTransport
from router.transports.mcp import McpTransport
from router.transports.mq import MqTransport
from router.transports.rest import RestDialect
from router.transports.websocket import WebSocketTransport


class Forwarder:
    """Every protocol's transport; the HTTP ones share one keep-alive connection pool for every agent. ``egress``:
    the rule the session's connections are held to, which gRPC channels and the broker (opened outside it) are held
    to too. ``broker``: where this router reaches mq agents (``redis://host:port``)."""

    def __init__(self, session: aiohttp.ClientSession, completion_url: str | None = None, broker: str | None = None,
                 egress: Egress | None = None):
        egress = egress or Egress()
        self._sockets = WebSocketTransport(session)
        self._channels = GrpcTransport(egress)
        self.queues = MqTransport(broker, egress)
        self._reporting: list[HttpTransport | WebSocketTransport | GrpcTransport | MqTransport | McpTransport] = [
            HttpTransport(session, AtpDialect()), HttpTransport(session, RestDialect()),
            HttpTransport(session, A2ADialect(A2AAgents(session))), self._sockets, self._channels, self.queues,
            McpTransport(session)]
        self.transports: dict[Protocol, Transport] = dict(zip(
            ("atp", "rest", "a2a", "websocket", "grpc", "mq", "mcp"), self._reporting, strict=True))
        self.completion_url = completion_url
        # Attempts by protocol and what each came to (an ErrorCode's value, or "ok"), for /metrics.
        self.attempts: Counter[tuple[str, str]] = Counter()

    @property
    def socket_connections(self) -> int:
        """WebSocket connections open to agents now."""
        return self._sockets.connections

    @property
    def grpc_channels(self) -> int:
        """gRPC channels connected to agents now."""
        return self._channels.connections

    @property
    def completion_url(self) -> str | None:
        """Where an agent may report a call's completion (X-Reach-Completion-Url); set once the router listens."""
        return self._reporting[0].completion_url

    @completion_url.setter
    def completion_url(self, url: str | None) -> None:
        for transport in self._reporting:
            transport.completion_url = url

    async def send(self, endpoint: str, protocol: Protocol, frame: RequestFrame, timeouts: ResolvedTimeouts,
                   signing_key: str | None = None, agent_id: str = "",
                   max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES, *, span: CallSpan,
                   relay: Relay | None = None) -> AgentAnswer:
        """``signing_key``: the key of the registration token the instance ``agent_id`` joined with, if any;
        the signature names ``agent_id`` so that it verifies at that instance only. An answer larger than
        ``max_answer_bytes`` (a stream's bytes all together) is ANSWER_TOO_LARGE. ``relay``: where a
        streamed answer's chunks go (a caller that streams asks the agent for a stream)."""
        answer = await self.transports[protocol].send(endpoint, frame, timeouts, signing_key, agent_id,
                                                      max_answer_bytes, span, relay or Relay())
        self.attempts[protocol, answer.error_code.value if answer.error_code is not None else "ok"] += 1
        return answer

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()
