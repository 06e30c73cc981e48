"""What an agent is doing now and has done so far: the numbers heartbeats, draining and the watchdog read."""

from __future__ import annotations

import asyncio
import itertools

COUNTERS = ("calls", "errors", "business_errors", "timeouts", "tokens")


class Inflight:
    """Calls in progress (request id and capability each), cumulative counters, and the draining flag."""

    def __init__(self, limit: int):
        self.limit = limit
        self.draining = False
        self.calls: dict[int, tuple[str, str]] = {}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._ids = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return len(self.calls)

    @property
    def load(self) -> float:
        return min(1.0, self.count / self.limit)

    def refuses(self) -> bool:
        """True while stopping or at the limit: a new native call gets a busy answer."""
        return self.draining or self.count >= self.limit

    def enter(self, request_id: str, capability: str) -> int:
        slot = next(self._ids)
        self.calls[slot] = (request_id, capability)
        self.counters["calls"] += 1
        self._idle.clear()
        return slot

    def leave(self, slot: int) -> None:
        del self.calls[slot]
        if not self.calls:
            self._idle.set()

    def count_outcome(self, outcome: str, tokens: int = 0) -> None:
        """Record how a call ended: "ok", "error", "business_error" or "timeout" (all but ok are errors)."""
        if outcome != "ok":
            self.counters["errors"] += 1
        if outcome in ("business_error", "timeout"):
            self.counters[outcome + "s"] += 1
        self.counters["tokens"] += tokens

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in progress; False if some still are after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
