"""Circuit breakers: stop sending calls where most of them fail, and test recovery with a few probes.

closed (calls flow; errors counted over a sliding window) -> open (error rate reached the threshold
on enough requests; nothing flows) -> half_open (``reset_seconds`` later; ``half_open_probes`` calls
may pass) -> closed on a successful probe, or open again for another ``reset_seconds`` on a failed one.

What counts as a failure is decided before ``record`` is called, by the outcome observer
(router/outcome.py: whose failure an answer was); answers that say nothing about the agent are not
recorded at all.
"""

from __future__ import annotations

import math
from collections import deque
from enum import StrEnum

import msgspec

from mesh.policy import BreakerConfig


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class SlidingWindow:
    """Requests and failures over the last ``seconds`` whole seconds, so old errors age out."""

    def __init__(self, seconds: int):
        self.seconds = seconds
        self._buckets: deque[list[int]] = deque()  # [second, requests, failures], oldest first
        self._requests = 0
        self._failures = 0
        self._expired_for = -1  # the second the window last aged out for: within it nothing more can

    def add(self, success: bool, now: float) -> None:
        second = math.floor(now)
        buckets = self._buckets
        # A slightly older clock value from a racing call lands in the newest bucket, keeping order.
        if buckets and buckets[-1][0] >= second:
            bucket = buckets[-1]
        else:
            self._expire(now)
            bucket = [second, 0, 0]
            buckets.append(bucket)
        bucket[1] += 1
        self._requests += 1
        if not success:
            bucket[2] += 1
            self._failures += 1

    def counts(self, now: float) -> tuple[int, int]:
        """(requests, failures) in the window that ends at ``now``."""
        self._expire(now)
        return self._requests, self._failures

    def clear(self) -> None:
        self._buckets.clear()
        self._requests = self._failures = 0

    def _expire(self, now: float) -> None:
        second = math.floor(now)
        if second <= self._expired_for:
            return
        self._expired_for = second
        oldest_kept = second - self.seconds + 1
        while self._buckets and self._buckets[0][0] < oldest_kept:
            _, requests, failures = self._buckets.popleft()
            self._requests -= requests
            self._failures -= failures


class BreakerSnapshot(msgspec.Struct, kw_only=True, frozen=True):
    """What metrics and the console show for one breaker."""

    state: BreakerState
    requests: int
    failures: int
    opened_at: float | None


class CircuitBreaker:
    """One breaker (per instance, or per capability); ``now`` is monotonic seconds."""

    def __init__(self, config: BreakerConfig):
        self.config = config
        self._window = SlidingWindow(config.window_seconds)
        self._opened_at: float | None = None
        self._probes_out = 0
        self._probe_sent_at = 0.0

    def state(self, now: float) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if now - self._opened_at < self.config.reset_seconds:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allow(self, now: float) -> bool:
        """May a call go through now? In half_open a True reserves one of the probes.

        A probe whose result never came back frees its place after ``reset_seconds``, so a lost
        probe cannot hold the breaker half-open forever.
        """
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        if self._probes_out and now - self._probe_sent_at >= self.config.reset_seconds:
            self._probes_out = 0
        if self._probes_out >= self.config.half_open_probes:
            return False
        self._probes_out += 1
        self._probe_sent_at = now
        return True

    def record(self, success: bool, now: float) -> None:
        """The outcome of one call that went through ``allow``.

        While open, or half-open with no probe out, the answer belongs to a call let through
        before the breaker opened; it says nothing about recovery and is ignored.
        """
        state = self.state(now)
        if state is BreakerState.CLOSED:
            self._window.add(success, now)
            requests, failures = self._window.counts(now)
            tripped = failures * 100 >= self.config.error_threshold_percent * requests
            if requests >= self.config.min_requests and tripped:
                self._open(now)
        elif state is BreakerState.HALF_OPEN and self._probes_out:
            if success:
                self._close()
            else:
                self._open(now)

    def snapshot(self, now: float) -> BreakerSnapshot:
        requests, failures = self._window.counts(now)
        return BreakerSnapshot(state=self.state(now), requests=requests, failures=failures, opened_at=self._opened_at)

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._probes_out = 0

    def _close(self) -> None:
        self._opened_at = None
        self._probes_out = 0
        self._window.clear()
