"""The audit trail's writer process: batches in on stdin, committed a window at a time, acknowledged on stdout.

AuditLog (router/audit.py) runs it as `python -m router.audit_writer PATH INSERT`, INSERT being the
statement each row runs (`executemany` over a batch: a JSON array of rows, each an array of the row's values in
the statement's column order, which executemany takes as they are). SQLite's share of a call — five index
updates per row and the commit's fsync — runs here, in a process of its own, so it takes neither the
router's GIL nor its event loop's time: in the router's aiosqlite thread it cost ~25 µs of the router's
CPU a call and stalled the loop's tail. Only the standard library is imported, so it starts fast.

A batch is a frame: a 4-byte big-endian length and then the body. The writer answers each batch, in
order, with an ACK: the rows it committed and whether that batch ended a transaction. The
length's top bit (SYNC) asks for a commit at once. Otherwise batches are gathered into one transaction
until COMMIT_ROWS rows or COMMIT_WINDOW_SECONDS after the first: two of the five indexes take random keys,
so every row of a small transaction dirties pages of its own, and a window of thousands of rows shares
them (bench/audit_bench.py). A batch is acknowledged only once committed, and the router keeps it until
then. On EOF — the router stopped or was killed — whatever was read is committed, and the writer exits.
A failed transaction ends the process with its traceback on stderr: the router sees the acks missing,
keeps the batches, and starts a new writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sqlite3
import struct
import sys
import time
from typing import BinaryIO

FRAME = struct.Struct(">I")
# The length's top bit: commit now (AuditLog.flush, which waits for it) rather than at the window's end.
SYNC = 1 << 31
ACK = struct.Struct(">I?")
# A transaction's size and age at most: what a query may wait behind AuditLog.flush, and the writer's memory
# (~5 MB of rows). On a 150,000-row trail, `bench/audit_bench.py`: ~33 µs a row at 500 rows a transaction,
# ~18 at 5,000, ~14 at 20,000.
COMMIT_ROWS = 10_000
COMMIT_WINDOW_SECONDS = 1.0
# Router workers share one file: a batch waits this long for another writer's commit (one fsync).
BUSY_TIMEOUT_SECONDS = 10.0
# Two of the five indexes (request_id, trace_id) take random keys: every row lands on another of their pages,
# which a batch reads (SQLite's default cache is 2 MiB) and writes to the WAL, and each checkpoint writes
# again. A cache that holds them and a checkpoint every 10,000 pages instead of 1,000 (a larger WAL, each
# page copied back once for many commits) cut the writer's CPU a row by a fifth on a 150,000-row trail
# (27 -> 22 µs; with rows sent as arrays, `bench/audit_bench.py --prefill 150000`: 42 -> 27 µs).
WRITER_PRAGMAS = ("PRAGMA synchronous=FULL",  # one fsync per batch: an acknowledged batch survives power loss
                  "PRAGMA cache_size=-32768",  # KiB: 32 MiB
                  "PRAGMA wal_autocheckpoint=10000")
WAL_RETRY_PAUSE = 0.01


def use_wal(db: sqlite3.Connection, patience: float = BUSY_TIMEOUT_SECONDS) -> None:
    """Put the file in WAL mode. Switching a new file takes an exclusive lock that SQLite does not wait
    for (its busy handler is skipped there), so router workers opening a new file together would see
    "database is locked" at once: each retries until the file is switched, by it or another."""
    deadline = time.monotonic() + patience
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(WAL_RETRY_PAUSE)


def switch_to_wal(path: str) -> None:
    """use_wal on a connection of its own: for AuditLog, which then opens its aiosqlite connection."""
    with contextlib.closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)) as db:
        use_wal(db)


class FrameReader:
    """Frames from a pipe read with os.read, so that select() tells whether more has come (a buffered
    reader would hide bytes it already holds)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._data = bytearray()
        self.eof = False

    def next(self, timeout: float | None) -> tuple[bytes, bool] | None:
        """The next batch and its SYNC flag; None when none came within ``timeout`` (None: wait) or at EOF."""
        while not self.eof:
            if len(self._data) >= FRAME.size:
                (head,) = FRAME.unpack_from(self._data)
                end = FRAME.size + (head & ~SYNC)
                if len(self._data) >= end:
                    body = bytes(self._data[FRAME.size:end])
                    del self._data[:end]
                    return body, bool(head & SYNC)
            if timeout is not None and not select.select([self.fd], [], [], max(0.0, timeout))[0]:
                return None
            chunk = os.read(self.fd, 1 << 20)
            self.eof = not chunk
            self._data += chunk
        if self._data:
            raise EOFError(f"a batch cut short: {len(self._data)} bytes after the last whole frame")
        return None


def serve(path: str, insert: str, requests: int, acks: BinaryIO) -> None:
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    reader = FrameReader(requests)
    try:
        use_wal(db)
        for pragma in WRITER_PRAGMAS:
            db.execute(pragma)
        while not reader.eof:
            window: list[list[object]] = []
            counts: list[int] = []
            ends_at = 0.0
            while len(window) < COMMIT_ROWS:
                got = reader.next(None if not counts else ends_at - time.monotonic())
                if got is None:
                    break
                rows = json.loads(got[0]) if got[0] else []
                window += rows
                counts.append(len(rows))
                ends_at = ends_at or time.monotonic() + COMMIT_WINDOW_SECONDS
                if got[1]:
                    break
            if counts:
                db.execute("BEGIN")
                db.executemany(insert, window)
                db.execute("COMMIT")
                acks.write(b"".join(ACK.pack(count, index == len(counts) - 1) for index, count in enumerate(counts)))
                acks.flush()
    finally:
        db.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.stdin.fileno(), sys.stdout.buffer)
