"""Whose outcome one attempt's answer was, and what it tells a breaker: the rule of whose failure it was
(decision 23), read once per answer as one ``Reading``, everything else by table.

Kept apart from the observer that applies it (router/outcome.py) so that the measurements
(router/measurements.py), which the observer feeds, judge by the same rule without importing the observer.

- counted as a success: the agent answered.
- counted as a failure: a timeout at the capability's own deadline, a connection that could not be made, a
  5xx, a malformed or oversized answer, a business error.
- never counted: an agent's busy answer (full, not broken), its refusal of the request itself, a timeout
  at a deadline the caller's hint brought forward (the caller's doing: counting it would let one caller
  open a breaker for every other), and the router's own failure (counting it would open every breaker at
  once).
"""

from __future__ import annotations

from enum import Enum

from agent_reach.atp import ErrorCode

from router.transports.answer import AgentAnswer

# An agent's answers that say the REQUEST was wrong (its form, size or content): the same request would
# fail at every instance, so they end the call and say nothing about the agent.
REQUEST_REFUSALS = frozenset({ErrorCode.INVALID_FRAME, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.INVALID_PAYLOAD})


class Reading(Enum):
    """Whose outcome one answer was."""

    SUCCESS = "success"
    CALLERS = "callers"  # the request refused, or the caller's own shorter deadline passed
    ROUTERS = "routers"  # the router failed itself (INTERNAL_ERROR: out of descriptors, say)
    BUSY = "busy"  # the agent is full, not broken
    UNREACHED = "unreached"  # no connection at the capability's own deadline: nothing was sent
    BUSINESS = "business"  # the agent answered that it cannot serve this call
    FAILED = "failed"  # any other failure of the agent's


# What a breaker records for each reading: True a success, False a failure, None nothing.
COUNTED: dict[Reading, bool | None] = {
    Reading.SUCCESS: True,
    Reading.CALLERS: None,
    Reading.ROUTERS: None,
    Reading.BUSY: None,
    Reading.UNREACHED: False,
    Reading.BUSINESS: False,
    Reading.FAILED: False,
}


def read(answer: AgentAnswer) -> Reading:
    """Whose outcome ``answer`` was (``cut_short`` already set by ``hurried``)."""
    code = answer.error_code
    if code is None:
        return Reading.SUCCESS
    if answer.cut_short or code in REQUEST_REFUSALS:
        return Reading.CALLERS
    if code is ErrorCode.INTERNAL_ERROR:
        return Reading.ROUTERS
    if code is ErrorCode.BUSY:
        return Reading.BUSY
    if not answer.sent:
        return Reading.UNREACHED
    if code is ErrorCode.BUSINESS_ERROR:
        return Reading.BUSINESS
    return Reading.FAILED


def verdict(answer: AgentAnswer | None) -> bool | None:
    """What ``answer`` tells a breaker: True a success, False a failure, None nothing (nor does no answer)."""
    if answer is None:
        return None
    return True if answer.error_code is None else COUNTED[read(answer)]  # a success without the table
