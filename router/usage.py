"""Who used how much: calls, tokens and cost per client, capability and instance, by hour and by day.

Fed by every call answered with a usage (agent_reach.usage: tokens the agent reported, or a price the
serving instance declares), read by ``GET /usage`` and the Prometheus counters. A call answered without
either costs the ledger nothing, so ``calls`` counts metered calls only. Memory is bounded: the last
``HOURS_KEPT`` hours and ``DAYS_KEPT`` days, and at most ``max_keys`` (client, capability, instance)
rows per bucket; calls past that are added to one ``OTHER`` row, so the totals stay exact. Each router
keeps its own ledger, counting the calls it routed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import msgspec
from agent_reach.usage import Usage

Period = Literal["hour", "day"]
PERIOD_SECONDS: dict[Period, int] = {"hour": 3600, "day": 86_400}
HOURS_KEPT = 48
DAYS_KEPT = 31
KEPT: dict[Period, int] = {"hour": HOURS_KEPT, "day": DAYS_KEPT}
MAX_KEYS = 2000
# The row of a bucket's calls past ``max_keys``: who they were is lost, how much they used is not.
OTHER = "(other)"
Key = tuple[str, str, str]  # client, capability, instance


class Totals(msgspec.Struct, kw_only=True):
    """What some calls used, added up."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    def add(self, usage: Usage) -> None:
        self.calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        if usage.cost is not None:
            self.cost += usage.cost

    def absorb(self, other: Totals) -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost += other.cost


class PeriodUsage(msgspec.Struct, kw_only=True):
    """One hour or day of usage: the whole, and broken down each way (after the request's filters)."""

    start: int  # unix seconds
    end: int
    total: Totals
    by_client: dict[str, Totals]
    by_capability: dict[str, Totals]
    by_instance: dict[str, Totals]


def summarise(start: int, seconds: int, rows: dict[Key, Totals], client: str | None,
              capability: str | None) -> PeriodUsage | None:
    """One bucket's rows added up for the filters given (None: any); None when no row matches."""
    total = Totals()
    views: tuple[dict[str, Totals], dict[str, Totals], dict[str, Totals]] = ({}, {}, {})
    for key, used in rows.items():
        if (client is not None and key[0] != client) or (capability is not None and key[1] != capability):
            continue
        total.absorb(used)
        for view, name in zip(views, key, strict=True):
            view.setdefault(name, Totals()).absorb(used)
    if not total.calls:
        return None
    return PeriodUsage(start=start, end=start + seconds, total=total, by_client=views[0], by_capability=views[1],
                       by_instance=views[2])


class UsageLedger:
    def __init__(self, max_keys: int = MAX_KEYS):
        self.max_keys = max_keys
        self._buckets: dict[Period, OrderedDict[int, dict[Key, Totals]]] = {period: OrderedDict()
                                                                            for period in PERIOD_SECONDS}
        # Since the router started, per capability: what the Prometheus counters read.
        self._lifetime: dict[str, Totals] = {}

    def record(self, client: str, capability: str, instance: str, usage: Usage, now: float) -> None:
        """Count one metered call, at wall-clock ``now``."""
        key = (client, capability, instance)
        for period, seconds in PERIOD_SECONDS.items():
            rows = self._bucket(period, int(now // seconds) * seconds)
            used = rows.get(key)
            if used is None:
                used = rows.setdefault(key if len(rows) < self.max_keys else (OTHER, OTHER, OTHER), Totals())
            used.add(usage)
        lifetime = self._lifetime.get(capability)
        if lifetime is None:
            lifetime = self._lifetime[capability] = Totals()
        lifetime.add(usage)

    def _bucket(self, period: Period, start: int) -> dict[Key, Totals]:
        buckets = self._buckets[period]
        rows = buckets.get(start)
        if rows is None:
            rows = buckets[start] = {}
            while len(buckets) > KEPT[period]:
                buckets.popitem(last=False)
        return rows

    def periods(self, period: Period, client: str | None = None, capability: str | None = None) -> list[PeriodUsage]:
        """The kept buckets of ``period`` with calls matching the filters, oldest first."""
        seconds = PERIOD_SECONDS[period]
        found = (summarise(start, seconds, rows, client, capability)
                 for start, rows in sorted(self._buckets[period].items()))
        return [summary for summary in found if summary is not None]

    def lifetime(self) -> dict[str, Totals]:
        return self._lifetime
