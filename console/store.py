"""Hour-level aggregates in SQLite, so an operator can look back a day after a restart.

Three tables of hours: reach per capability (folded from closed router periods, each exactly once
thanks to a per-capability watermark), attempts per agent and capability (from traces), and route
decisions (from counter deltas). Counts are stored as the router's ``Tally`` in JSON, so hours merge
with the same code as periods. ``meta`` keeps what a restarted console must not count twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from console.models import HourRow
from console.rollup import quantile, reach_of
from console.traffic import Sample, Usage
from router.reach import PeriodSummary, Tally, merged
from wal.private import create_private_file

HOUR = 3600
KEEP_HOURS = 24 * 7

SCHEMA = """
CREATE TABLE IF NOT EXISTS reach_hours (
    hour INTEGER NOT NULL, capability TEXT NOT NULL, tally TEXT NOT NULL, PRIMARY KEY (hour, capability));
CREATE TABLE IF NOT EXISTS reach_folded (capability TEXT PRIMARY KEY, last_start REAL NOT NULL);
CREATE TABLE IF NOT EXISTS agent_hours (
    hour INTEGER NOT NULL, agent_id TEXT NOT NULL, capability TEXT NOT NULL, tally TEXT NOT NULL,
    tokens INTEGER NOT NULL, cost REAL NOT NULL DEFAULT 0, PRIMARY KEY (hour, agent_id, capability));
CREATE TABLE IF NOT EXISTS decision_hours (
    hour INTEGER NOT NULL, decision TEXT NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (hour, decision));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_tally_decoder = msgspec.json.Decoder(Tally)
_decoder = msgspec.json.Decoder()


def hour_of(moment: float) -> int:
    return int(moment // HOUR * HOUR)


def _tally(text: str) -> Tally:
    return _tally_decoder.decode(text)


def _usage(tally: str, tokens: int, cost: float) -> Usage:
    return Usage(tally=_tally(tally), tokens=tokens, cost=cost)


def _text(value: object) -> str:
    return msgspec.json.encode(value).decode()


class ConsoleStore:
    def __init__(self, path: Path):
        self.path = path
        self._db: aiosqlite.Connection | None = None

    @property
    def db(self) -> aiosqlite.Connection:
        assert self._db is not None, "ConsoleStore.open() first"
        return self._db

    async def open(self) -> None:
        create_private_file(self.path)  # 0600 before SQLite opens it: its -wal and -shm files copy the mode
        self._db = await aiosqlite.connect(self.path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.executescript(SCHEMA)
        async with self._db.execute("PRAGMA table_info(agent_hours)") as cursor:
            if "cost" not in {row[1] for row in await cursor.fetchall()}:  # a store kept before calls had a cost
                await self._db.execute("ALTER TABLE agent_hours ADD COLUMN cost REAL NOT NULL DEFAULT 0")
        await self._db.commit()

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def get_meta(self, key: str, default: object = None) -> Any:
        async with self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)) as cursor:
            row = await cursor.fetchone()
        return _decoder.decode(row[0]) if row else default

    async def _put_meta(self, key: str, value: object) -> None:
        await self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _text(value)))

    async def fold_periods(self, periods: Iterable[PeriodSummary]) -> int:
        """Add each closed period not yet folded into its capability's hour; returns how many."""
        async with self.db.execute("SELECT capability, last_start FROM reach_folded") as cursor:
            folded = {row[0]: row[1] for row in await cursor.fetchall()}
        fresh = sorted((p for p in periods if p.closed and p.start > folded.get(p.capability, float("-inf"))),
                       key=lambda p: p.start)
        if not fresh:
            return 0
        hours: dict[tuple[int, str], list[PeriodSummary]] = {}
        for period in fresh:
            hours.setdefault((hour_of(period.start), period.capability), []).append(period)
            folded[period.capability] = max(folded.get(period.capability, period.start), period.start)
        for (hour, capability), parts in hours.items():
            async with self.db.execute("SELECT tally FROM reach_hours WHERE hour = ? AND capability = ?",
                                       (hour, capability)) as cursor:
                row = await cursor.fetchone()
            tally = merged([_tally(row[0]), *parts]) if row else merged(parts)
            await self.db.execute("INSERT OR REPLACE INTO reach_hours (hour, capability, tally) VALUES (?, ?, ?)",
                                  (hour, capability, _text(tally)))
        await self.db.executemany("INSERT OR REPLACE INTO reach_folded (capability, last_start) VALUES (?, ?)",
                                  list(folded.items()))
        await self.db.commit()
        return len(fresh)

    async def add_samples(self, samples: list[Sample], watermark: float) -> None:
        """Count attempts into their agent's hour, and remember the newest trace start counted."""
        usage: dict[tuple[int, str, str], Usage] = {}
        for sample in samples:
            usage.setdefault((hour_of(sample.at), sample.agent_id, sample.capability), Usage()).add(sample)
        for (hour, agent_id, capability), used in usage.items():
            async with self.db.execute(
                    "SELECT tally, tokens, cost FROM agent_hours WHERE hour = ? AND agent_id = ? AND capability = ?",
                    (hour, agent_id, capability)) as cursor:
                row = await cursor.fetchone()
            if row:
                used.absorb(_usage(*row))
            await self.db.execute(
                "INSERT OR REPLACE INTO agent_hours (hour, agent_id, capability, tally, tokens, cost) "
                "VALUES (?, ?, ?, ?, ?, ?)", (hour, agent_id, capability, _text(used.tally), used.tokens, used.cost))
        await self._put_meta("traces_watermark", watermark)
        await self.db.commit()

    async def add_decisions(self, deltas: dict[str, int], counters: dict[str, int], now: float) -> None:
        """Count route decisions into this hour; keep the router's counters to diff after a restart."""
        hour = hour_of(now)
        await self.db.executemany(
            "INSERT INTO decision_hours (hour, decision, count) VALUES (?, ?, ?) "
            "ON CONFLICT (hour, decision) DO UPDATE SET count = count + excluded.count",
            [(hour, name, count) for name, count in deltas.items()])
        await self._put_meta("decision_counters", counters)
        await self.db.commit()

    async def reach_hours(self, since: float) -> list[HourRow]:
        return await self._hours("SELECT hour, tally, 0, 0 FROM reach_hours WHERE hour >= ?", (hour_of(since),))

    async def agent_hours(self, agent_id: str, since: float) -> list[HourRow]:
        return await self._hours("SELECT hour, tally, tokens, cost FROM agent_hours WHERE hour >= ? AND agent_id = ?",
                                 (hour_of(since), agent_id))

    async def decision_hours(self, since: float) -> list[HourRow]:
        async with self.db.execute("SELECT hour, decision, count FROM decision_hours WHERE hour >= ? ORDER BY hour",
                                   (hour_of(since),)) as cursor:
            found: dict[int, dict[str, int]] = {}
            for hour, decision, count in await cursor.fetchall():
                found.setdefault(hour, {})[decision] = count
        return [HourRow(hour=hour, total=sum(decisions.values()), decisions=decisions)
                for hour, decisions in found.items()]

    async def _hours(self, sql: str, params: tuple[object, ...]) -> list[HourRow]:
        """Rows of (hour, tally, tokens, cost) merged per hour, oldest first."""
        by_hour: dict[int, Usage] = {}
        async with self.db.execute(sql, params) as cursor:
            for hour, *row in await cursor.fetchall():
                by_hour.setdefault(hour, Usage()).absorb(_usage(*row))
        return [HourRow(hour=hour, total=used.tally.total, success=used.tally.success,
                        degraded=used.tally.degraded, failed=used.tally.failed,
                        tokens=used.tokens, cost=used.cost, reach_rate=reach_of(used.tally),
                        latency_p95_ms=quantile(used.tally, 0.95), latency_p99_ms=quantile(used.tally, 0.99))
                for hour, used in sorted(by_hour.items())]

    async def prune(self, now: float | None = None) -> None:
        """Forget hours older than a week."""
        oldest = hour_of((now or time.time()) - KEEP_HOURS * HOUR)
        for table in ("reach_hours", "agent_hours", "decision_hours"):
            await self.db.execute(f"DELETE FROM {table} WHERE hour < ?", (oldest,))
        await self.db.commit()
