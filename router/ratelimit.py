"""Token buckets: per instance, so the router never sends an instance more than its ``max_qps``;
per client, so one caller cannot take the whole router.

Every limit is the mesh's, not one router's: each router fills its buckets at its share of it
(1 / live routers, from the registry's watch feed), so N routers together admit the limit once.
"""

from __future__ import annotations

import math
from collections.abc import Callable


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

    def retune(self, rate: float) -> None:
        """A new rate (the router's share moved, or the limit did), with the default burst. Tokens held
        are kept up to the new burst, so a share that moves back and forth hands out no extra burst."""
        unlimited = self.rate <= 0
        self.rate = rate
        self.burst = max(1.0, rate)
        self._tokens = self.burst if unlimited else min(self._tokens, self.burst)

    def _refill(self, now: float) -> None:
        if self._updated is None:
            self._updated = now
        elif now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now


def limit_share(live_routers: int) -> float:
    """This router's fraction of every limit: an equal split among the live routers, itself included."""
    return 1.0 / max(1, live_routers)


def whole_share() -> float:
    """A router alone (no feed has told it of others)."""
    return 1.0


class SharedBuckets:
    """One bucket per key, at ``share()`` of the limit it is asked for, retuned when either moves."""

    def __init__(self, share: Callable[[], float] = whole_share):
        self._share = share
        self._buckets: dict[str, TokenBucket] = {}

    def get(self, key: str, limit: float) -> TokenBucket:
        """The bucket for ``key``; ``limit`` is the mesh-wide rate (0 or less: unlimited)."""
        rate = limit * self._share()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(rate)
        elif bucket.rate != rate:
            bucket.retune(rate)
        return bucket

    def forget(self, keep: set[str]) -> None:
        for key in [key for key in self._buckets if key not in keep]:
            del self._buckets[key]


class ClientLimits:
    """One bucket per client id, at this router's share of the rate the client is allowed now."""

    def __init__(self, share: Callable[[], float] = whole_share):
        self._buckets = SharedBuckets(share)

    def retry_after(self, client_id: str, rate: float, now: float) -> int | None:
        """None when the call may go (a token is taken); else whole seconds (≥ 1) until one is back."""
        if rate <= 0:
            return None
        bucket = self._buckets.get(client_id, rate)
        if bucket.try_take(now):
            return None
        return max(1, math.ceil(bucket.seconds_to_token(now)))
