"""A token bucket per instance, so the router never sends an instance more than its ``max_qps``."""

from __future__ import annotations

import math


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; a rate of 0 or less means unlimited.

    The bucket starts full. ``now`` is monotonic seconds; a ``now`` older than the last one seen
    adds nothing (calls racing on one loop may pass slightly out-of-order clocks).
    """

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._tokens = self.burst
        self._updated: float | None = None

    def try_take(self, now: float) -> bool:
        """Take one token if there is one; never waits."""
        if self.rate <= 0:
            return True
        self._refill(now)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def available(self, now: float) -> float:
        """Tokens in the bucket right now (``inf`` when unlimited)."""
        if self.rate <= 0:
            return math.inf
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        if self._updated is None:
            self._updated = now
        elif now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
