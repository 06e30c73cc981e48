"""Per-agent traffic read from the router's call traces: QPS, latency percentiles, tokens, errors.

The router counts reach per capability; only its traces say which instance served which attempt,
so the agent views are built from them. Each attempt is one sample; a call's tokens belong to the
instance that answered it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from console.models import TrafficStat
from console.rollup import quantile
from router.reach import Outcome, Tally, absorb
from router.traces import CallTrace

QPS_SECONDS = 60.0
WINDOW_SECONDS = 300.0


class Sample(msgspec.Struct, frozen=True, array_like=True):
    at: float
    agent_id: str
    capability: str
    elapsed_ms: float
    error_code: str | None
    tokens: int
    cost: float = 0.0


def samples_of(call: CallTrace) -> list[Sample]:
    """One sample per attempt, stamped with when the attempt started on the wall clock."""
    answerer = len(call.attempts) - 1 if call.outcome != "failed" else -1
    usage = call.usage
    tokens, cost = (usage.input_tokens + usage.output_tokens, usage.cost or 0.0) if usage is not None else (0, 0.0)
    return [Sample(at=call.started_at + attempt.started_ms / 1000, agent_id=attempt.instance,
                   capability=call.capability, elapsed_ms=attempt.elapsed_ms, error_code=attempt.error_code,
                   tokens=tokens if index == answerer else 0, cost=cost if index == answerer else 0.0)
            for index, attempt in enumerate(call.attempts)]


class Usage(msgspec.Struct, kw_only=True):
    """Attempts counted as a Tally (so percentiles merge like the router's) plus their tokens and cost."""

    tally: Tally = msgspec.field(default_factory=Tally)
    tokens: int = 0
    cost: float = 0.0

    def add(self, sample: Sample) -> None:
        outcome: Outcome = "failed" if sample.error_code else "success"
        self.tally.add(outcome, sample.error_code, sample.elapsed_ms)
        self.tokens += sample.tokens
        self.cost += sample.cost

    def absorb(self, other: Usage) -> None:
        absorb(self.tally, other.tally)
        self.tokens += other.tokens
        self.cost += other.cost


def stat(usage: Usage, recent_calls: int) -> TrafficStat:
    tally = usage.tally
    return TrafficStat(calls=tally.total, qps=round(recent_calls / QPS_SECONDS, 3), errors=tally.failed,
                       errors_by_code=dict(tally.failed_by_code), tokens=usage.tokens, cost=usage.cost,
                       latency_p95_ms=quantile(tally, 0.95), latency_p99_ms=quantile(tally, 0.99))


class TrafficWindow:
    """The last ``WINDOW_SECONDS`` of attempts, added up per second and per (agent, capability),
    so a summary costs the number of busy seconds and keys, not the number of calls."""

    def __init__(self) -> None:
        self._seconds: dict[int, dict[tuple[str, str], Usage]] = {}

    def add(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            second = self._seconds.setdefault(int(sample.at), {})
            second.setdefault((sample.agent_id, sample.capability), Usage()).add(sample)

    def by_agent(self, now: float) -> dict[str, TrafficStat]:
        return self._summarise(now, lambda agent_id, capability: agent_id)

    def by_capability(self, agent_id: str, now: float) -> dict[str, TrafficStat]:
        return self._summarise(now, lambda agent, capability: capability if agent == agent_id else None)

    def _summarise(self, now: float, key: Callable[[str, str], str | None]) -> dict[str, TrafficStat]:
        for second in [second for second in self._seconds if second < now - WINDOW_SECONDS]:
            del self._seconds[second]
        usage: dict[str, Usage] = {}
        recent: dict[str, int] = {}
        for second, used_by in self._seconds.items():
            for (agent_id, capability), used in used_by.items():
                name = key(agent_id, capability)
                if name is None:
                    continue
                usage.setdefault(name, Usage()).absorb(used)
                if second >= now - QPS_SECONDS:
                    recent[name] = recent.get(name, 0) + used.tally.total
        return {name: stat(used, recent.get(name, 0)) for name, used in usage.items()}
