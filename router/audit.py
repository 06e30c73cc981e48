"""The audit trail: one row per call in SQLite, written in batches off the request path.

After an incident the question is which data flowed from which caller to which agent. So each call
keeps who called (client and how it authenticated), what it asked for, which instance answered,
how it ended, and the payload's size and SHA-256 digest — never the payload itself.

``record()`` only appends to a bounded in-memory buffer; a background task hands the buffer, a batch
(one JSON array) at a time, to a writer process (router/audit_writer.py) that commits batches a window
at a time (up to a second's worth) and acknowledges each batch once committed; the router keeps a batch
until then, and does not wait for it. SQLite's work thus never runs in the router's process.
Retention deletes (at start and every ``prune_interval``) and queries run on the router's own aiosqlite
connection: rare, and readers never wait for the writer in WAL mode.

What a crash loses: a batch is kept until the writer acknowledges its commit, so a writer that dies
loses nothing (a new one is started and the batches sent again; a commit whose ack was lost comes back
as a duplicate row). A router killed outright (SIGKILL) loses the rows not yet handed over (the writer
commits what it holds when its input closes): those
recorded since the last hand-off, which happens every ``batch_size`` rows and every ``flush_interval``
— fewer than ``batch_size`` rows while the writer keeps up, at most ``max_buffer`` if it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import sys
import time
from collections import deque
from pathlib import Path
from typing import Literal, cast

import aiosqlite
import msgspec
from agent_reach.usage import Usage

from router.audit_writer import ACK, BUSY_TIMEOUT_SECONDS, FRAME, SYNC, switch_to_wal
from router.traces import AttemptTrace
from wal.private import create_private_file

log = logging.getLogger("agentreach.router.audit")

AuditOutcome = Literal["success", "degraded", "failed", "refused"]
AuthMethod = Literal["api_key", "jwt"]

DAY = 86_400.0
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Entries buffered at most: past it calls are dropped and counted, never held up by the audit disk.
MAX_BUFFER = 50_000
# Codes that mean the caller was turned away before anything was forwarded.
REFUSAL_CODES = frozenset({"UNAUTHENTICATED", "FORBIDDEN", "TRUST_LEVEL_INSUFFICIENT"})


class AuditEntry(msgspec.Struct, gc=False):
    """One call as the audit trail keeps it. Field order is the table's column order."""

    time: float  # unix seconds, when the call arrived
    capability: str
    request_id: str
    outcome: AuditOutcome
    latency_ms: float = 0.0
    caller: str | None = None  # client_id; None when the caller could not be identified (or auth is off)
    caller_name: str | None = None
    instance: str | None = None  # agent_id of the last attempt; None when nothing was forwarded
    trace_id: str | None = None
    parent_request_id: str | None = None
    error_code: str | None = None
    payload_bytes: int = 0
    payload_sha256: str | None = None  # hex digest of the payload bytes, never the payload
    auth_method: AuthMethod | None = None
    rule: str | None = None  # the policy rule that decided where the call went
    # A streamed answer's chunks and their bytes (all of them, whatever the caller read); None: not streamed.
    chunks: int | None = None
    chunk_bytes: int | None = None
    # The answer's usage and its cost (agent_reach.usage); None: the agent reported none and the instance has no price.
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None


class AuditFilter(msgspec.Struct, kw_only=True, frozen=True):
    """What GET /audit may ask for; ``since`` is inclusive, ``until`` exclusive (unix seconds)."""

    capability: str | None = None
    caller: str | None = None
    request_id: str | None = None
    trace_id: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = DEFAULT_LIMIT


COLUMNS = tuple(AuditEntry.__struct_fields__)
_FILTER_COLUMNS = ("capability", "caller", "request_id", "trace_id")

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL, capability TEXT NOT NULL, request_id TEXT NOT NULL, outcome TEXT NOT NULL,
    latency_ms REAL NOT NULL, caller TEXT, caller_name TEXT, instance TEXT, trace_id TEXT,
    parent_request_id TEXT, error_code TEXT, payload_bytes INTEGER NOT NULL, payload_sha256 TEXT,
    auth_method TEXT, rule TEXT, chunks INTEGER, chunk_bytes INTEGER, input_tokens INTEGER, output_tokens INTEGER,
    cost REAL);
CREATE INDEX IF NOT EXISTS audit_time ON audit (time);
CREATE INDEX IF NOT EXISTS audit_capability ON audit (capability, time);
CREATE INDEX IF NOT EXISTS audit_caller ON audit (caller, time);
CREATE INDEX IF NOT EXISTS audit_request_id ON audit (request_id);
CREATE INDEX IF NOT EXISTS audit_trace_id ON audit (trace_id);
"""
# The writer process decodes a batch (one JSON array) and inserts it with `executemany`: in a process
# of its own that takes no GIL from the loop, and costs less CPU than SQLite unpacking the array
# itself (`INSERT ... SELECT json_extract(...) FROM json_each(?)`: ~11 against ~7 µs a row). Each row is
# an array of its values in column order, which executemany takes as it is decoded (rows as objects cost
# the writer ~1 µs a row more to decode and turn into tuples; the router the same to encode either way).
# Columns added after the first release: a trail written before gains them (NULL in its old rows).
ADDED_COLUMNS = (("rule", "TEXT"), ("chunks", "INTEGER"), ("chunk_bytes", "INTEGER"), ("input_tokens", "INTEGER"),
                 ("output_tokens", "INTEGER"), ("cost", "REAL"))
INSERT = f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_batch_encoder = msgspec.json.Encoder()
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM audit"


def call_entry(*, started_at: float, capability: str, request_id: str, outcome: str, error_code: str | None,
               latency_ms: float, caller_id: str | None, caller_name: str | None, auth_method: AuthMethod | None,
               tried: list[AttemptTrace], trace_id: str, parent_request_id: str | None, payload_bytes: int,
               payload_sha256: str | None, rule: str | None, usage: Usage | None, streamed: bool, chunks: int,
               chunk_bytes: int) -> AuditEntry:
    """The audit row for a routed call, from the facts the router holds when it ends: built directly,
    not from its CallTrace, which only sampled calls get (building both cost every call ~3 µs)."""
    stream = streamed or chunks  # streamed to the caller, or to the router only
    return AuditEntry(
        time=started_at, capability=capability, request_id=request_id,
        outcome="refused" if error_code in REFUSAL_CODES else cast(AuditOutcome, outcome),
        latency_ms=latency_ms, caller=caller_id, caller_name=caller_name,
        instance=tried[-1].instance if tried else None, trace_id=trace_id,
        parent_request_id=parent_request_id, error_code=error_code,
        payload_bytes=payload_bytes, payload_sha256=payload_sha256, auth_method=auth_method, rule=rule,
        chunks=chunks if stream else None, chunk_bytes=chunk_bytes if stream else None,
        input_tokens=None if usage is None else usage.input_tokens,
        output_tokens=None if usage is None else usage.output_tokens, cost=None if usage is None else usage.cost)


def where(filters: AuditFilter) -> tuple[str, list[object]]:
    """The WHERE clause and its parameters for a filter (values are always bound, never inlined)."""
    clauses, params = [], []
    for column in _FILTER_COLUMNS:
        value = getattr(filters, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if filters.since is not None:
        clauses.append("time >= ?")
        params.append(filters.since)
    if filters.until is not None:
        clauses.append("time < ?")
        params.append(filters.until)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


class AuditLog:
    """A bounded buffer in front of a SQLite table, drained by one background task into a writer process."""

    def __init__(self, path: Path, retention_days: float, *, batch_size: int = 500, flush_interval: float = 0.5,
                 max_buffer: int = MAX_BUFFER, prune_interval: float = 600.0):
        if retention_days <= 0:
            raise ValueError("retention_days must be positive")
        if not 1 <= batch_size <= max_buffer:
            raise ValueError("batch_size must be at least 1 and at most max_buffer")
        self.path = path
        self.retention_days = retention_days
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.prune_interval = prune_interval
        self.written = 0
        self.batches = 0
        self.commits = 0  # the writer's transactions: a window of batches each (router/audit_writer.py)
        self.dropped = 0
        self._unreported_drops = 0
        self._buffer: list[AuditEntry] = []
        # Handed to the writer, not yet acknowledged as committed: oldest first, an ack per batch in order.
        self._unacked: deque[list[AuditEntry]] = deque()
        self._unacked_rows = 0
        self._acked = asyncio.Event()  # set by the ack reader at each ack, and when the writer is gone
        self._acks: asyncio.Task[None] | None = None
        self._db: aiosqlite.Connection | None = None  # schema, retention and queries
        self._process: asyncio.subprocess.Process | None = None  # router/audit_writer.py: every insert
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._stopping = asyncio.Event()  # ends a failed write's back-off at once

    @property
    def pending(self) -> int:
        """Rows not yet handed to the writer: what a router killed now would lose."""
        return len(self._buffer)

    @property
    def unacknowledged(self) -> int:
        """Rows handed to the writer and not yet committed (kept here until they are)."""
        return self._unacked_rows

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid (None before start and after stop): for an operator's `ps`, and tests."""
        return None if self._process is None else self._process.pid

    def record(self, entry: AuditEntry) -> None:
        """Queue one entry: an append, or a counted drop when the buffer is full or the log stopped."""
        buffer = self._buffer
        if self._closed or len(buffer) + self._unacked_rows >= self.max_buffer:
            self.dropped += 1
            self._unreported_drops += 1
            return
        buffer.append(entry)
        if len(buffer) == self.batch_size:
            self._wake.set()

    async def start(self) -> None:
        create_private_file(self.path)  # 0600 before SQLite opens it: its -wal and -shm files copy the mode
        await asyncio.to_thread(switch_to_wal, str(self.path))  # WAL is the file's mode from then on
        self._db = await aiosqlite.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS)
        # FULL: one fsync per committed batch, so a batch acknowledged as written survives power loss;
        # batching makes that a few fsyncs a second, on aiosqlite's thread, never on the event loop.
        await self._db.execute("PRAGMA synchronous=FULL")
        await self._db.executescript(SCHEMA)
        await self._add_missing_columns(self._db)
        await self._db.commit()
        await self.prune()
        await self._start_writer()
        log.info("audit trail open", extra={"path": str(self.path), "retention_days": self.retention_days})
        self._writer = asyncio.create_task(self._write_forever(), name="audit-writer")

    @staticmethod
    async def _add_missing_columns(db: aiosqlite.Connection) -> None:
        for column, kind in ADDED_COLUMNS:
            async with db.execute("PRAGMA table_info(audit)") as cursor:
                present = {row[1] for row in await cursor.fetchall()}
            if column not in present:
                # Router workers open the file together: one adds it, the others find it added.
                with contextlib.suppress(sqlite3.OperationalError):
                    await db.execute(f"ALTER TABLE audit ADD COLUMN {column} {kind}")

    async def _start_writer(self) -> None:
        # A session of its own: a terminal's Ctrl-C or a signal to the router's group must not end it
        # before the router's last batch; the EOF of its stdin does, even when the router is killed.
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "router.audit_writer", str(self.path), INSERT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
        self._acks = asyncio.create_task(self._read_acks(self._process), name="audit-acks")

    async def _read_acks(self, process: asyncio.subprocess.Process) -> None:
        """Count each acknowledged batch as written; at the writer's EOF (it exited, or died) just stop:
        whoever waits on an ack finds the writer gone."""
        assert process.stdout is not None
        try:
            while True:
                rows, ends_commit = ACK.unpack(await process.stdout.readexactly(ACK.size))
                batch = self._unacked.popleft()
                self._unacked_rows -= len(batch)
                self.written += rows
                self.batches += 1 if batch else 0
                self.commits += ends_commit
                self._acked.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._acked.set()

    async def _stop_writer(self) -> None:
        """Close the writer's stdin and wait for it to exit (it has committed all it acknowledged)."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        with contextlib.suppress(ConnectionError):
            await process.stdin.wait_closed()
        await process.wait()
        if self._acks is not None:
            await self._acks  # it reads the writer's last acks, then its EOF
            self._acks = None

    async def stop(self) -> None:
        """Stop taking entries, let the writer finish its batch, write the rest, close."""
        self._closed = True
        self._wake.set()
        self._stopping.set()
        if self._writer is not None:
            await self._writer
            self._writer = None
        if self._db is not None:
            try:
                await self._last_flush()
            finally:
                await self._stop_writer()
                await self._db.close()
                self._db = None

    async def _last_flush(self) -> None:
        """Flush; once more if the writer had died (the failed flush started a new one and kept the rows)."""
        try:
            await self.flush()
        except Exception:
            log.warning("audit write failed at stop; retrying with a new writer", exc_info=True)
            await self.flush()

    async def flush(self) -> None:
        """Write everything buffered so far and wait until the writer has committed it all; raises if the
        writer process fails (the batches not acknowledged are buffered again, and a new writer is started
        for the next try)."""
        async with self._lock:
            assert self._db is not None, "AuditLog.start() first"
            try:
                await self._hand_off(sync=True)
                while self._unacked:
                    self._acked.clear()
                    if self._acks is None or self._acks.done():
                        raise asyncio.IncompleteReadError(b"", ACK.size)  # the writer's traceback is on stderr
                    await self._acked.wait()
            except BaseException:  # cancelled too: a new writer, so no stale ack answers a later batch
                await self._restart_writer()
                raise
            finally:
                self._report_drops()

    async def _hand_off(self, sync: bool) -> None:
        """Send the buffer to the writer, a batch per frame, without waiting for commits; ``sync`` asks
        for a commit of everything sent (an empty frame carries it when nothing is buffered)."""
        process = self._process
        assert process is not None and process.stdin is not None
        taken, self._buffer = self._buffer, []
        batches = [taken[first:first + self.batch_size] for first in range(0, len(taken), self.batch_size)]
        if sync and self._unacked and not batches:
            batches = [[]]
        for index, batch in enumerate(batches):
            body = _batch_encoder.encode([msgspec.structs.astuple(entry) for entry in batch]) if batch else b""
            last = index == len(batches) - 1
            process.stdin.write(FRAME.pack(len(body) | (SYNC if sync and last else 0)) + body)
            self._unacked.append(batch)
            self._unacked_rows += len(batch)
        await process.stdin.drain()

    async def _restart_writer(self) -> None:
        """A new writer, the old one's unacknowledged batches buffered again in front, oldest first."""
        process = self._process
        if process is not None and process.returncode is None:
            process.kill()
        await self._stop_writer()
        unwritten = [entry for batch in self._unacked for entry in batch]
        self._unacked.clear()
        self._unacked_rows = 0
        self._requeue(unwritten)
        await self._start_writer()

    async def prune(self, now: float | None = None) -> int:
        """Delete rows older than the retention period; returns how many went."""
        cutoff = (time.time() if now is None else now) - self.retention_days * DAY
        async with self._lock:
            assert self._db is not None, "AuditLog.start() first"
            cursor = await self._db.execute("DELETE FROM audit WHERE time < ?", (cutoff,))
            await self._db.commit()
        if cursor.rowcount:
            log.info("audit rows past retention deleted", extra={"deleted": cursor.rowcount, "before": cutoff})
        return cursor.rowcount

    async def query(self, filters: AuditFilter) -> list[AuditEntry]:
        """Committed entries matching ``filters``, newest first."""
        clause, params = where(filters)
        sql = f"{_SELECT}{clause} ORDER BY time DESC, id DESC LIMIT ?"
        async with self._lock:  # never between a batch's insert and its commit
            assert self._db is not None, "AuditLog.start() first"
            async with self._db.execute(sql, [*params, filters.limit]) as cursor:
                rows = await cursor.fetchall()
        return [AuditEntry(*row) for row in rows]

    def _requeue(self, unwritten: list[AuditEntry]) -> None:
        """Put entries a failed write took back in front, oldest first, still within the bound."""
        merged = unwritten + self._buffer
        overflow = len(merged) - self.max_buffer
        if overflow > 0:
            self.dropped += overflow
            self._unreported_drops += overflow
            merged = merged[:self.max_buffer]
        self._buffer = merged

    def _report_drops(self) -> None:
        """Log drops here, once per write, rather than in record(): a full buffer must not flood the log."""
        if self._unreported_drops:
            log.warning("audit buffer full; entries dropped",
                        extra={"dropped": self._unreported_drops, "dropped_total": self.dropped,
                               "max_buffer": self.max_buffer})
            self._unreported_drops = 0

    async def _write_forever(self) -> None:
        pruned_at = time.monotonic()
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            self._wake.clear()
            try:
                async with self._lock:
                    if self._acks is None or self._acks.done():  # the writer died: its batches go again
                        await self._restart_writer()
                    await self._hand_off(sync=False)
                    self._report_drops()
                if time.monotonic() - pruned_at >= self.prune_interval:
                    pruned_at = time.monotonic()
                    await self.prune()
            except Exception:
                log.exception("audit write failed; retrying", extra={"pending": len(self._buffer)})
                with contextlib.suppress(TimeoutError):  # back off (the wake event may be set again), not past stop()
                    await asyncio.wait_for(self._stopping.wait(), self.flush_interval)
