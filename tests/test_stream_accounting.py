"""A streamed call is counted once wherever calls are counted: one trace, one audit row (with its chunk
count, bytes and duration) and one call in the reach ledger, however many chunks it had."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from router.audit import AuditEntry, AuditFilter, AuditLog
from stream_support import read_stream


async def test_a_stream_is_one_row_with_its_chunks_bytes_and_duration(start_mesh, make_agent, http, tmp_path):
    mesh = await start_mesh(router_settings={"audit_path": tmp_path / "audit.db"})
    agent = make_agent("counted-1", mesh.registry.url)

    @agent.capability("stream.counted", timeout_sla_ms=5000)
    async def counted(payload, ctx):
        for n in range(5):
            await asyncio.sleep(0.01)
            yield "x" * n

    await agent.start()
    await mesh.until_state("counted-1")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.counted", "request_id": "c-1"})
    assert len(streamed.chunks) == 5
    assert (await mesh.call("stream.counted", None, request_id="c-2")).status == 200

    rows = {row["request_id"]: row for row in (await mesh.get("/audit?capability=stream.counted"))["entries"]}
    assert set(rows) == {"c-1", "c-2"}
    sizes = sum(len(f'"{"x" * n}"') for n in range(5))
    assert (rows["c-1"]["chunks"], rows["c-1"]["chunk_bytes"], rows["c-1"]["outcome"]) == (5, sizes, "success")
    # A caller that does not stream is not asked a stream of the agent: the SDK answers the last chunk.
    assert (rows["c-2"]["chunks"], rows["c-2"]["chunk_bytes"]) == (None, None)
    assert rows["c-1"]["latency_ms"] >= 40  # the whole stream, four 10 ms sleeps at least
    totals = await mesh.reach_totals("stream.counted")
    assert (totals["total"], totals["success"]) == (2, 2)


async def test_an_audit_trail_written_before_streams_gains_their_columns(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE audit (id INTEGER PRIMARY KEY, time REAL NOT NULL, capability TEXT NOT NULL, "
                    "request_id TEXT NOT NULL, outcome TEXT NOT NULL, latency_ms REAL NOT NULL, caller TEXT, "
                    "caller_name TEXT, instance TEXT, trace_id TEXT, parent_request_id TEXT, error_code TEXT, "
                    "payload_bytes INTEGER NOT NULL, payload_sha256 TEXT, auth_method TEXT)")
        old.execute("INSERT INTO audit (time, capability, request_id, outcome, latency_ms, payload_bytes) "
                    "VALUES (?, 'old.cap', 'old-1', 'success', 1, 0)", (time.time(),))
    trail = AuditLog(path, 30)
    await trail.start()
    try:
        trail.record(AuditEntry(time=time.time(), capability="new.cap", request_id="new-1", outcome="success", chunks=3,
                                chunk_bytes=12))
        await trail.flush()
        rows = {row.request_id: row for row in await trail.query(AuditFilter())}
    finally:
        await trail.stop()
    assert (rows["old-1"].chunks, rows["new-1"].chunks, rows["new-1"].chunk_bytes) == (None, 3, 12)

