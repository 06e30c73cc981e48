"""What one attempt's answer means: for the instance that gave it, for its capability, and for the call.

One owner for the rule of whose failure it was (decision 23), the breakers' counts, passive ejection and
reinstatement, kept apart from choosing instances as Envoy keeps outlier detection apart from load
balancing: the router's attempt loop sends, hands each answer to ``Observer.observe`` and follows the
``Step`` it gets back.

An answer is read once, as one ``Reading``; everything else follows from that reading by table:
- counted as a success: the agent answered.
- counted as a failure: a timeout at the capability's own deadline, a connection that could not be made, a
  5xx, a malformed or oversized answer, a business error.
- never counted: an agent's busy answer (full, not broken), its refusal of the request itself, a timeout
  at a deadline the caller's hint brought forward (the caller's doing: counting it would let one caller
  open a breaker for every other), and the router's own failure (counting it would open every breaker at
  once).
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import TYPE_CHECKING

from agent_reach.atp import ErrorCode

from router.breaker import CircuitBreaker
from router.instances import InstanceBook
from router.timeouts import ResolvedTimeouts
from router.transports.answer import AgentAnswer

if TYPE_CHECKING:
    from router.measurements import Measurements

log = logging.getLogger("agentreach.router")

# An agent's answers that say the REQUEST was wrong (its form, size or content): the same request would
# fail at every instance, so they end the call and say nothing about the agent.
REQUEST_REFUSALS = frozenset({ErrorCode.INVALID_FRAME, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.INVALID_PAYLOAD})

_DEADLINES = {ErrorCode.CONNECT_TIMEOUT: "connect_s", ErrorCode.FIRST_BYTE_TIMEOUT: "first_byte_s",
              ErrorCode.TOTAL_TIMEOUT: "total_s"}


class Reading(Enum):
    """Whose outcome one answer was."""

    SUCCESS = "success"
    CALLERS = "callers"  # the request refused, or the caller's own shorter deadline passed
    ROUTERS = "routers"  # the router failed itself (INTERNAL_ERROR: out of descriptors, say)
    BUSY = "busy"  # the agent is full, not broken
    UNREACHED = "unreached"  # no connection at the capability's own deadline: nothing was sent
    BUSINESS = "business"  # the agent answered that it cannot serve this call
    FAILED = "failed"  # any other failure of the agent's


class Step(Enum):
    """What the attempt loop does after an answer."""

    DONE = "done"  # the answer is the call's: a success, or a failure no other instance would mend
    NEXT = "next"  # try the next instance; a retry is not spent (nothing was sent, or the agent was busy)
    RETRY = "retry"  # try the next instance while the capability's retries allow


# What a breaker records for each reading: True a success, False a failure, None nothing.
_COUNTED: dict[Reading, bool | None] = {
    Reading.SUCCESS: True, Reading.CALLERS: None, Reading.ROUTERS: None, Reading.BUSY: None,
    Reading.UNREACHED: False, Reading.BUSINESS: False, Reading.FAILED: False,
}
# Out of descriptors, trying every instance is a failover storm; a caller's deadline is no instance's to mend.
_STEPS: dict[Reading, Step] = {
    Reading.SUCCESS: Step.DONE, Reading.CALLERS: Step.DONE, Reading.ROUTERS: Step.DONE, Reading.BUSY: Step.NEXT,
    Reading.UNREACHED: Step.NEXT, Reading.BUSINESS: Step.DONE, Reading.FAILED: Step.RETRY,
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
    return True if answer.error_code is None else _COUNTED[read(answer)]  # a success without the table


def hurried(code: ErrorCode | None, given: ResolvedTimeouts, own: ResolvedTimeouts) -> bool:
    """Whether the timeout ``code`` fired at a deadline shorter in ``given`` (the caller's hint applied)
    than in ``own`` (the capability's)."""
    deadline = _DEADLINES.get(code) if code is not None else None
    return deadline is not None and getattr(given, deadline) < getattr(own, deadline)


class Observer:
    """Applies what answers mean to the router's instance book (breakers, ejections, reinstatements) and,
    when given them, to its measurements (router/measurements.py), judging each answer once."""

    def __init__(self, book: InstanceBook, measurements: Measurements | None = None):
        self.book = book
        self.measurements = measurements

    def observe(self, breaker: CircuitBreaker, instance: str, answer: AgentAnswer, now: float,
                capability: str = "") -> Step:
        """Account one attempt's ``answer`` from ``instance`` of ``capability`` (``breaker``: the instance's for
        this capability, the one the attempt passed) and say what the call does next."""
        if answer.error_code is None:  # the common case, without the table
            breaker.record(True, now)
            self.book.reinstate(instance)
            if self.measurements is not None:
                self.measurements.record(capability, instance, answer, True)
            return Step.DONE
        reading = read(answer)
        counted = _COUNTED[reading]
        if self.measurements is not None:
            self.measurements.record(capability, instance, answer, counted)
        if counted is not None:
            # Business errors count as failures even though the agent answered HTTP 200.
            breaker.record(counted, now)
        if reading is Reading.UNREACHED:
            seconds = self.book.eject(instance, now)
            log.warning("instance ejected: connection failed", extra={
                "instance": instance, "eject_seconds": seconds, "error": answer.message})
        return _STEPS[reading]

    @staticmethod
    def observe_capability(breaker: CircuitBreaker, answer: AgentAnswer | None, now: float) -> None:
        """Account a call's final ``answer`` (None: no instance was tried) to its capability's breaker,
        by the same rule as the instances' breakers."""
        counted = verdict(answer)
        if counted is not None:
            breaker.record(counted, now)
