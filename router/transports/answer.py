"""What one attempt at an agent produced, in the same terms whatever the protocol, and the readings every
transport shares: a status that is no answer, a malformed answer, a router short of system resources."""

from __future__ import annotations

import errno
from typing import Any

import msgspec
from agent_reach.atp import BusinessError, ErrorCode, agent_status_code
from agent_reach.exhaustion import local_exhaustion
from agent_reach.usage import Usage


class AgentAnswer(msgspec.Struct, kw_only=True):
    """What one attempt produced: a result, or an error code with its story."""

    error_code: ErrorCode | None = None
    message: str = ""
    # False when the request never reached the agent (refused, connect timeout): failing over is safe.
    sent: bool = True
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: BusinessError | None = None
    elapsed_ms: float = 0.0
    # True when the deadline that ended it was not the capability's own (the caller's timeout_hint brought
    # it forward, or the budget ran out before any instance was tried): it says nothing about the agent.
    cut_short: bool = False
    # Chunks of a streamed answer this attempt passed on: after the first, the call is never failed over.
    chunks: int = 0
    # The tokens the agent reported for the call (None: none, or a report the router could not read).
    usage: Usage | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None


def failed_status(status: int) -> AgentAnswer:
    """What a status outside 2xx says when the body is no frame (or, for rest, whatever the body)."""
    code = agent_status_code(status)
    refused = code not in (ErrorCode.AGENT_ERROR, ErrorCode.BUSY)
    return AgentAnswer(error_code=code, message=f"agent refused the request (HTTP {status})" if refused
                       else f"agent answered HTTP {status}")


def malformed(what: str) -> AgentAnswer:
    return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered a malformed answer: {what}")


def short_of_resources(exc: BaseException, sent: bool) -> AgentAnswer | None:
    """INTERNAL_ERROR when ``exc`` came of the router running out of descriptors, socket buffers or memory:
    no agent is to blame, and none would fare better; None for any other failure."""
    exhausted = local_exhaustion(exc)
    if exhausted is None:
        return None
    name = errno.errorcode.get(exhausted.errno or 0, str(exhausted.errno))
    happened = "the agent may have received the call" if sent else "nothing was sent"
    return AgentAnswer(error_code=ErrorCode.INTERNAL_ERROR, sent=sent,
                       message=f"the router ran out of a system resource ({name}); {happened}")
