"""Benchmark the audit trail: what a call pays on the request path, and rows written per second.

    python bench/audit_bench.py [--entries N] [--prefill N] [--json out.json]

Request path: the payload's SHA-256 (1 KiB payload), call_entry and AuditLog.record, each
timed over N calls. Writes: N buffered entries flushed through the writer process in batches of a few
sizes, which it commits a window at a time (router/audit_writer.py COMMIT_ROWS; synchronous=FULL, WAL),
into a SQLite file in the system temp dir.
Steady: 40,000 entries recorded at 8,000/s, the CPU per row in the router's process and in the
writer's, and the loop's lateness; with --prefill, into a trail that already holds that many rows (a
trail's random-key indexes cost more a row as they outgrow the writer's cache). Request and trace ids
are random, as the router's are (new_request_id).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from agent_reach.atp import new_request_id

from common import cpu_seconds, rank_at
from router.audit import AuditEntry, AuditLog, call_entry
from router.traces import AttemptTrace

BATCH_SIZES = (100, 500, 2000)


def entries(count: int, digest: str = "ab" * 32) -> list[AuditEntry]:
    """``count`` rows as the router builds them for a call answered by its first attempt."""
    tried = [AttemptTrace(instance="agent-1", endpoint="http://127.0.0.1:9000/atp", protocol="atp",
                          started_ms=0.1, elapsed_ms=2.0)]
    return [call_entry(started_at=time.time(), capability=f"cap.{n % 20}", request_id=new_request_id(),
                       outcome="success", error_code=None, latency_ms=2.5, caller_id="cl_1", caller_name="shop",
                       auth_method="api_key", tried=tried, trace_id=new_request_id(), parent_request_id=None,
                       payload_bytes=1024, payload_sha256=digest, rule=None, usage=None, streamed=False, chunks=0,
                       chunk_bytes=0)
            for n in range(count)]


def per_call_us(started: float, count: int) -> float:
    return round((time.perf_counter() - started) / count * 1e6, 3)


async def request_path(directory: Path, count: int) -> dict[str, float]:
    payload = b"x" * 1024
    started = time.perf_counter()
    for _ in range(count):
        hashlib.sha256(payload).hexdigest()
    sha_us = per_call_us(started, count)
    digest = hashlib.sha256(payload).hexdigest()
    started = time.perf_counter()
    made = entries(count, digest)
    entry_us = per_call_us(started, count)
    audit = AuditLog(directory / "record.db", retention_days=30, batch_size=count, max_buffer=count)
    await audit.start()
    started = time.perf_counter()
    for entry in made:  # no await in between: the writer cannot run, so this is record() alone
        audit.record(entry)
    record_us = per_call_us(started, count)
    await audit.stop()
    return {"sha256_1KiB_us": sha_us, "call_entry_us": entry_us, "record_us": record_us}


async def writes(directory: Path, count: int, batch_size: int) -> dict[str, float]:
    made = entries(count)
    audit = AuditLog(directory / f"writes-{batch_size}.db", retention_days=30, batch_size=batch_size,
                     max_buffer=count, flush_interval=3600)
    await audit.start()
    for entry in made:
        audit.record(entry)
    started = time.perf_counter()
    await audit.flush()
    elapsed = time.perf_counter() - started
    await audit.stop()
    return {"batch_size": batch_size, "entries": count, "seconds": round(elapsed, 3),
            "entries_per_second": round(count / elapsed)}


async def steady(directory: Path, count: int, rate: int, prefill: int) -> dict[str, float]:
    """``count`` entries recorded at ``rate`` a second, 50 at a time (a loaded router's pace), into a trail
    of ``prefill`` rows: the CPU a row costs the router's process (recording, encoding, the pipe) and the
    writer process, and how late the loop wakes for its timers meanwhile (what a call waits behind the
    audit trail)."""
    made = entries(count)
    audit = AuditLog(directory / "steady.db", retention_days=30, max_buffer=max(prefill, 50_000))
    await audit.start()
    for entry in entries(prefill):
        audit.record(entry)
    await audit.flush()
    assert audit.writer_pid is not None
    writer_before, router_before = cpu_seconds(audit.writer_pid), cpu_seconds(os.getpid())
    started, lateness = time.perf_counter(), []
    for first in range(0, count, 50):
        for entry in made[first:first + 50]:
            audit.record(entry)
        due = started + (first + 50) / rate
        now = time.perf_counter()
        await asyncio.sleep(max(0.0, due - now))
        lateness.append(time.perf_counter() - max(due, now))
    await audit.flush()
    router, writer = cpu_seconds(os.getpid()) - router_before, cpu_seconds(audit.writer_pid) - writer_before
    await audit.stop()
    lateness.sort()
    return {"entries": count, "rate": rate, "prefill": prefill,
            "router_process_us_per_row": round(router / count * 1e6, 2),
            "writer_process_us_per_row": round(writer / count * 1e6, 2),
            "loop_lateness_p99_ms": round(rank_at(lateness, 0.99) * 1e3, 3)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--prefill", type=int, default=0, help="rows in the trail before the steady run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as scratch:
        directory = Path(scratch)
        result = {"request_path": await request_path(directory, args.entries),
                  "writes": [await writes(directory, args.entries, size) for size in BATCH_SIZES],
                  "steady": await steady(directory, min(args.entries, 40_000), 8_000, args.prefill)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
