"""Token buckets: per instance, so the router never sends an instance more than its ``max_qps``;
per client, so one caller cannot take the whole router."""

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

    def seconds_to_token(self, now: float) -> float:
        """How long until a token is back (0 when one is there)."""
        if self.rate <= 0:
            return 0.0
        self._refill(now)
        return max(0.0, (1 - self._tokens) / self.rate)

    def _refill(self, now: float) -> None:
        if self._updated is None:
            self._updated = now
        elif now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now


class ClientLimits:
    """One bucket per client id, made (or remade) at the rate the client is allowed now."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def retry_after(self, client_id: str, rate: float, now: float) -> int | None:
        """None when the call may go (a token is taken); else whole seconds (≥ 1) until one is back."""
        if rate <= 0:
            return None
        bucket = self._buckets.get(client_id)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[client_id] = TokenBucket(rate)
        if bucket.try_take(now):
            return None
        return max(1, math.ceil(bucket.seconds_to_token(now)))
