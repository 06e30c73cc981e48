"""Weighted version splits (canaries): which share a call belongs to, and when a canary must be rolled back.

Assignment hashes the session (the request when there is none) onto the weights, so every call of one
conversation lands on one version, and every router assigns it alike without sharing state. The
judgement compares each canary's window with stable's (the heaviest share); the I/O side writes the
rollback to the registry so every router follows.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque

import msgspec

from mesh.policy import RollbackConfig, SplitShare

_SCALE = 2**64


def share_point(capability: str, key: str) -> float:
    """A stable point in [0, 1) for a session of a capability: the same on every router and every run."""
    digest = hashlib.blake2b(f"{capability}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def assign(split: list[SplitShare], point: float) -> int | None:
    """The index of the share ``point`` falls in, by cumulative weight; None when every weight is 0."""
    total = sum(share.weight for share in split)
    if total == 0:
        return None
    target, running = point * total, 0
    for index, share in enumerate(split):
        running += share.weight
        if share.weight and target < running:
            return index
    return max(i for i, share in enumerate(split) if share.weight)  # float rounding at the very top


def stable_index(split: list[SplitShare]) -> int:
    """Stable is the heaviest share (the first of equals): what a canary is judged against."""
    return max(range(len(split)), key=lambda index: (split[index].weight, -index))


class Sample(msgspec.Struct, array_like=True, frozen=True):
    at: float  # monotonic seconds
    ok: bool
    ms: float


class WindowFigures(msgspec.Struct, frozen=True):
    calls: int
    error_rate: float
    p99_ms: float


def figures(samples: list[Sample]) -> WindowFigures:
    latencies = sorted(sample.ms for sample in samples)
    p99 = latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)] if latencies else 0.0
    errors = sum(1 for sample in samples if not sample.ok)
    return WindowFigures(calls=len(samples), error_rate=errors / len(samples) if samples else 0.0, p99_ms=p99)


def rollback_reason(config: RollbackConfig, canary: WindowFigures, stable: WindowFigures) -> str | None:
    """Why the canary must go (one sentence), or None while it holds or the sample is too small."""
    if canary.calls < config.min_calls or stable.calls < config.min_calls:
        return None
    worse = getattr(canary, config.metric) - getattr(stable, config.metric)
    if worse <= config.worse_than_stable_by:
        return None
    return (f"{config.metric} {getattr(canary, config.metric):.4g} vs stable {getattr(stable, config.metric):.4g} "
            f"over {canary.calls} and {stable.calls} calls in {config.window_seconds:g} s: worse by {worse:.4g}, "
            f"more than {config.worse_than_stable_by:g}")


# Outcomes kept per share: the window's figures come from at most this many of its latest calls, so a busy
# stable version costs bounded memory and a bounded sort once a second.
SAMPLES_PER_SHARE = 10_000


class CanaryWindows:
    """Per capability and share version: the outcomes of the last ``window_seconds`` (at most SAMPLES_PER_SHARE)."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], deque[Sample]] = {}

    def record(self, capability: str, version: str, sample: Sample) -> None:
        kept = self._samples.get((capability, version))
        if kept is None:
            kept = self._samples[(capability, version)] = deque(maxlen=SAMPLES_PER_SHARE)
        kept.append(sample)

    def window(self, capability: str, version: str, now: float, seconds: float) -> list[Sample]:
        kept = self._samples.get((capability, version))
        if kept is None:
            return []
        while kept and kept[0].at < now - seconds:
            kept.popleft()
        return list(kept)

    def forget(self, capability: str, version: str) -> None:
        """A rolled-back share starts over: its old failures must not roll back its next attempt."""
        self._samples.pop((capability, version), None)
