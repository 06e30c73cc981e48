"""The audit trail's writer process: batches in on stdin, one transaction each, acknowledged on stdout.

AuditLog (router/audit.py) runs it as `python -m router.audit_writer PATH INSERT`, INSERT being the
statement each row runs (`executemany` over a batch: a JSON array of rows, each an array of the row's values in
the statement's column order, which executemany takes as they are). SQLite's share of a call — five index
updates per row and the batch's fsync — runs here, in a process of its own, so it takes neither the
router's GIL nor its event loop's time: in the router's aiosqlite thread it cost ~25 µs of the router's
CPU a call and stalled the loop's tail. Only the standard library is imported, so it starts fast.

A frame, each way, is a 4-byte big-endian length and then the body: the router sends the batch, the
writer answers with the rows it committed (the length field alone, no body). On EOF — the router
stopped or was killed — whatever was read has been committed, and the writer exits. A failed
transaction ends the process with its traceback on stderr: the router sees the ack missing, keeps the
batch, and starts a new writer.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import struct
import sys
import time
from typing import BinaryIO

FRAME = struct.Struct(">I")
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


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's body; None at a clean EOF (between frames)."""
    head = stream.read(FRAME.size)
    if not head:
        return None
    (length,) = FRAME.unpack(head)
    body = stream.read(length)
    if len(body) != length:
        raise EOFError(f"a batch cut short: {len(body)} of {length} bytes")
    return body


def serve(path: str, insert: str, requests: BinaryIO, acks: BinaryIO) -> None:
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    try:
        use_wal(db)
        for pragma in WRITER_PRAGMAS:
            db.execute(pragma)
        while (batch := read_frame(requests)) is not None:
            rows = json.loads(batch)
            db.execute("BEGIN")
            db.executemany(insert, rows)
            db.execute("COMMIT")
            acks.write(FRAME.pack(len(rows)))
            acks.flush()
    finally:
        db.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.stdin.buffer, sys.stdout.buffer)
