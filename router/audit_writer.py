"""The audit trail's writer process: batches in on stdin, one transaction each, acknowledged on stdout.

AuditLog (router/audit.py) runs it as `python -m router.audit_writer PATH INSERT`, INSERT being the
statement each row runs (`executemany` over a batch, a JSON array of rows). SQLite's share of a call — five index
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

import json
import sqlite3
import struct
import sys
from typing import BinaryIO

FRAME = struct.Struct(">I")
# Router workers share one file: a batch waits this long for another writer's commit (one fsync).
BUSY_TIMEOUT_SECONDS = 10.0


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
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # one fsync per batch: an acknowledged batch survives power loss
        while (batch := read_frame(requests)) is not None:
            # Each row a JSON object whose values come in the table's column order (AuditEntry's fields).
            rows = [tuple(row.values()) for row in json.loads(batch)]
            db.execute("BEGIN")
            db.executemany(insert, rows)
            db.execute("COMMIT")
            acks.write(FRAME.pack(len(rows)))
            acks.flush()
    finally:
        db.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.stdin.buffer, sys.stdout.buffer)
