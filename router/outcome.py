"""What one attempt's answer means: for the instance that gave it, for its capability, and for the call.

One owner for applying the rule of whose failure it was (router/verdicts.py) to the breakers' counts, passive
ejection and reinstatement, kept apart from choosing instances as Envoy keeps outlier detection apart from load
balancing: the router's attempt loop sends, hands each answer to ``Observer.observe`` and follows the
``Step`` it gets back.
"""

from __future__ import annotations

import logging
from enum import Enum

from agent_reach.atp import ErrorCode

from router.breaker import CircuitBreaker
from router.instances import InstanceBook
from router.measurements import Measurements
from router.timeouts import ResolvedTimeouts
from router.transports.answer import AgentAnswer
from router.verdicts import COUNTED, Reading, read, verdict

log = logging.getLogger("agentreach.router")

_DEADLINES = {ErrorCode.CONNECT_TIMEOUT: "connect_s", ErrorCode.FIRST_BYTE_TIMEOUT: "first_byte_s",
              ErrorCode.TOTAL_TIMEOUT: "total_s"}


class Step(Enum):
    """What the attempt loop does after an answer."""

    DONE = "done"  # the answer is the call's: a success, or a failure no other instance would mend
    NEXT = "next"  # try the next instance; a retry is not spent (nothing was sent, or the agent was busy)
    RETRY = "retry"  # try the next instance while the capability's retries allow


# Out of descriptors, trying every instance is a failover storm; a caller's deadline is no instance's to mend.
_STEPS: dict[Reading, Step] = {
    Reading.SUCCESS: Step.DONE, Reading.CALLERS: Step.DONE, Reading.ROUTERS: Step.DONE, Reading.BUSY: Step.NEXT,
    Reading.UNREACHED: Step.NEXT, Reading.BUSINESS: Step.DONE, Reading.FAILED: Step.RETRY,
}


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
        counted = COUNTED[reading]
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
