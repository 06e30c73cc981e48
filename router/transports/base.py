"""The one shape every transport has: send a call to an instance within its deadlines, relaying a streamed
answer's chunks as they come, and answer what came back as an AgentAnswer (never raise for an agent's
failure: a timeout, a refused connection, garbage are answers with an error code)."""

from __future__ import annotations

from typing import Protocol

from agent_reach.atp import RequestFrame

from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer

# An answer past this is refused while it is read, never buffered whole (RouterSettings.max_answer_bytes).
DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024
# A connection (a WebSocket, a gRPC channel) no call used for this long is closed: an instance gone from the
# feed leaves nothing open behind.
IDLE_CLOSE_S = 300.0


class Transport(Protocol):
    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        """``signing_key``: the key of the registration token the instance ``agent_id`` joined with, if any;
        the call is signed for that instance only. An answer larger than ``max_answer_bytes`` (a stream's
        bytes all together) is ANSWER_TOO_LARGE. ``relay``: where a streamed answer's chunks go (a caller
        that streams asks the agent for a stream)."""
        ...

    async def close(self) -> None:
        """Release what the transport holds open (connections, channels); the router is stopping."""
        ...
