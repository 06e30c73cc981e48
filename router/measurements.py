"""What this router has measured of each instance, per capability, from its own live calls.

The scored policy (router/scoring.py) reads these; nothing here decides. Only real calls feed them, never
probes (a probe loads the service it measures), and each router learns from its own calls: routers do not
share measurements.

- latency: an EWMA of the elapsed time of the counted attempts the agent received, ``LATENCY_ALPHA`` = 0.3:
  a new sample weighs 30 %, so after a step change in latency the average has moved half-way within 2 calls
  and 90 % of the way within 7. An attempt that timed out after it was sent never showed its latency, only
  that it was longer than the deadline: it counts as ``TIMED_OUT_FACTOR`` (2) times its elapsed time, so an
  instance that keeps timing out soon averages past its SLA (twice in a row from a fast start).
- errors: the share of failures among the last ``ERROR_WINDOW`` counted attempts, counted by the breakers'
  rule (router/verdicts.py ``verdict``): timeouts, connection failures, agent errors and business errors are
  failures; busy answers, the caller's errors (its refused request, its own shorter deadline) and the
  router's own failure are not counted at all.

Memory is bounded by the instances the registry lists: ``forget`` drops the rest.
"""

from __future__ import annotations

from collections import deque

from agent_reach.atp import ErrorCode

from router.transports.answer import AgentAnswer
from router.verdicts import verdict

LATENCY_ALPHA = 0.3
ERROR_WINDOW = 20
TIMED_OUT_FACTOR = 2.0
# Deadlines that pass once the agent has the call (a connect timeout never reached it: no latency to learn).
_TIMED_OUT = frozenset({ErrorCode.FIRST_BYTE_TIMEOUT, ErrorCode.TOTAL_TIMEOUT, ErrorCode.IDLE_TIMEOUT})


class Measured:
    """One instance's live figures for one capability; read by the scorer, changed only by ``observe``."""

    __slots__ = ("_outcomes", "errors", "latency_ms")

    def __init__(self) -> None:
        self.latency_ms: float | None = None  # None until an attempt was answered
        self._outcomes: deque[bool] = deque(maxlen=ERROR_WINDOW)  # True: a failure
        self.errors = 0  # failures among _outcomes

    @property
    def samples(self) -> int:
        """Counted attempts in the error window (at most ERROR_WINDOW)."""
        return len(self._outcomes)

    @property
    def error_rate(self) -> float:
        return self.errors / len(self._outcomes) if self._outcomes else 0.0

    def count(self, failed: bool) -> None:
        if len(self._outcomes) == ERROR_WINDOW:
            self.errors -= self._outcomes[0]
        self._outcomes.append(failed)
        self.errors += failed

    def latency(self, elapsed_ms: float) -> None:
        previous = self.latency_ms
        self.latency_ms = elapsed_ms if previous is None else previous + LATENCY_ALPHA * (elapsed_ms - previous)


class Measurements:
    """Every (capability, instance) this router has called, with what its calls showed."""

    def __init__(self) -> None:
        self._measured: dict[tuple[str, str], Measured] = {}

    def get(self, capability: str, agent_id: str) -> Measured | None:
        """None: never measured (the scorer's optimistic prior applies)."""
        return self._measured.get((capability, agent_id))

    def observe(self, capability: str, agent_id: str, answer: AgentAnswer) -> None:
        """Account one attempt's answer, judged here by the breakers' rule."""
        self.record(capability, agent_id, answer, verdict(answer))

    def record(self, capability: str, agent_id: str, answer: AgentAnswer, counted: bool | None) -> None:
        """Account one attempt's answer as ``counted`` (its verdict, as the outcome observer judged it: the
        router's calls are not judged twice); one that says nothing of the instance changes nothing."""
        if counted is None:
            return
        measured = self._measured.get((capability, agent_id))
        if measured is None:
            measured = self._measured[(capability, agent_id)] = Measured()
        measured.count(not counted)
        if answer.sent:
            timed_out = answer.error_code in _TIMED_OUT
            measured.latency(answer.elapsed_ms * TIMED_OUT_FACTOR if timed_out else answer.elapsed_ms)

    def forget(self, live: set[str]) -> None:
        """Drop the figures of instances that left the registry."""
        for key in [key for key in self._measured if key[1] not in live]:
            del self._measured[key]
