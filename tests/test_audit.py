"""The audit trail: batched SQLite writes, GET /audit over real HTTP, retention, restarts, bounds."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from agent_reach.serving import listen
from aiohttp import web

from conftest import wait_for
from router.api import guarded
from router.app_keys import AUDIT_KEY
from router.audit import AuditEntry, AuditFilter, AuditLog, call_entry
from router.audit_query import FilterError, parse_filters
from router.inspection import audit_entries
from router.traces import AttemptTrace

DAY = 86_400.0


def rows_in(path: Path) -> int:
    """Rows committed to the file, read by a separate SQLite connection (what survives the process)."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM audit").fetchone()[0]


def entry(n: int, **fields: object) -> AuditEntry:
    values: dict[str, object] = {
        "time": time.time(), "capability": "order.read", "request_id": f"req-{n}", "outcome": "success",
        "latency_ms": 1.5, "caller": "cl_a", "caller_name": "shop", "instance": "agent-1", "trace_id": f"trace-{n}",
        "payload_bytes": 10, "payload_sha256": hashlib.sha256(f"payload {n}".encode()).hexdigest(),
        "auth_method": "api_key"}
    values.update(fields)
    return AuditEntry(**values)  # type: ignore[arg-type]


@pytest.fixture
async def open_log(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[AuditLog]]]:
    """Started AuditLogs on tmp_path/audit.db; each is stopped at teardown."""
    logs: list[AuditLog] = []

    async def start(**knobs: object) -> AuditLog:
        knobs.setdefault("retention_days", 30.0)
        audit = AuditLog(tmp_path / "audit.db", **knobs)  # type: ignore[arg-type]
        await audit.start()
        logs.append(audit)
        return audit

    yield start
    for audit in logs:
        await audit.stop()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[AuditLog], Awaitable[str]]]:
    """A real aiohttp server on 127.0.0.1 with just GET /audit; returns its URL."""
    runners: list[web.AppRunner] = []

    async def start(audit: AuditLog) -> str:
        app = web.Application()
        app[AUDIT_KEY] = audit
        app.router.add_get("/audit", guarded(audit_entries))
        runner, port = await listen(app, "127.0.0.1", 0)
        runners.append(runner)
        return f"http://127.0.0.1:{port}/audit"

    yield start
    for runner in runners:
        await runner.cleanup()


async def get(http: aiohttp.ClientSession, url: str, **params: str) -> tuple[int, dict]:
    async with http.get(url, params=params) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


def ids(body: dict) -> list[str]:
    return [row["request_id"] for row in body["entries"]]


async def test_background_writer_wakes_on_a_full_batch(open_log, tmp_path: Path) -> None:
    audit = await open_log(batch_size=10, flush_interval=60.0)
    for n in range(25):
        audit.record(entry(n))
    # The 10th entry wakes the writer long before its 60 s interval; it writes all 25, in 3 transactions.
    await wait_for(lambda: rows_in(tmp_path / "audit.db") == 25, what="the batches committed")
    assert audit.pending == 0 and audit.written == 25 and audit.batches == 3


async def test_interval_writes_a_partial_batch(open_log, tmp_path: Path) -> None:
    audit = await open_log(batch_size=1000, flush_interval=0.05)
    audit.record(entry(1))
    await wait_for(lambda: rows_in(tmp_path / "audit.db") == 1, what="the interval's write")


async def test_each_filter_over_http(open_log, serve, http) -> None:
    audit = await open_log(batch_size=4)
    base = 1_700_000_000.0
    audit.record(entry(1, time=base + 1, capability="order.read", caller="cl_a", trace_id="t1"))
    audit.record(entry(2, time=base + 2, capability="order.write", caller="cl_a", trace_id="t1",
                       parent_request_id="req-1"))
    audit.record(entry(3, time=base + 3, capability="order.read", caller="cl_b", trace_id="t2"))
    audit.record(entry(4, time=base + 4, capability="weather.now", caller=None, caller_name=None,
                       auth_method=None, trace_id="t3", outcome="refused", error_code="UNAUTHENTICATED",
                       instance=None))
    url = await serve(audit)

    status, body = await get(http, url)
    assert status == 200 and ids(body) == ["req-4", "req-3", "req-2", "req-1"]  # newest first
    assert ids((await get(http, url, capability="order.read"))[1]) == ["req-3", "req-1"]
    assert ids((await get(http, url, caller="cl_a"))[1]) == ["req-2", "req-1"]
    assert ids((await get(http, url, request_id="req-3"))[1]) == ["req-3"]
    assert ids((await get(http, url, trace_id="t1"))[1]) == ["req-2", "req-1"]
    assert ids((await get(http, url, since=str(base + 2)))[1]) == ["req-4", "req-3", "req-2"]
    assert ids((await get(http, url, until=str(base + 3)))[1]) == ["req-2", "req-1"]  # until is exclusive
    assert ids((await get(http, url, since=str(base + 2), until=str(base + 4)))[1]) == ["req-3", "req-2"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + 3))
    assert ids((await get(http, url, since=iso))[1]) == ["req-4", "req-3"]
    assert ids((await get(http, url, since=iso.replace("Z", "+00:00")))[1]) == ["req-4", "req-3"]
    assert ids((await get(http, url, capability="order.read", caller="cl_b"))[1]) == ["req-3"]
    assert ids((await get(http, url, limit="2"))[1]) == ["req-4", "req-3"]
    assert (await get(http, url, capability="nothing.here"))[1] == {"entries": []}

    refused = (await get(http, url, request_id="req-4"))[1]["entries"][0]
    assert refused == {"time": base + 4, "capability": "weather.now", "request_id": "req-4", "outcome": "refused",
                       "latency_ms": 1.5, "caller": None, "caller_name": None, "instance": None, "trace_id": "t3",
                       "parent_request_id": None, "error_code": "UNAUTHENTICATED", "payload_bytes": 10,
                       "payload_sha256": hashlib.sha256(b"payload 4").hexdigest(), "auth_method": None,
                       "rule": None, "chunks": None, "chunk_bytes": None, "input_tokens": None,
                       "output_tokens": None, "cost": None}
    assert (await get(http, url, request_id="req-2"))[1]["entries"][0]["parent_request_id"] == "req-1"


async def test_query_sees_a_call_recorded_just_now(open_log, serve, http) -> None:
    audit = await open_log(batch_size=1000, flush_interval=60.0)
    url = await serve(audit)
    audit.record(entry(7))
    assert audit.pending == 1
    assert ids((await get(http, url, request_id="req-7"))[1]) == ["req-7"]
    assert audit.pending == 0


async def test_digest_stored_payload_never(open_log, tmp_path: Path) -> None:
    payload = b'{"card":"4111-1111-1111-1111","owner":"Ada Lovelace"}'
    digest = hashlib.sha256(payload).hexdigest()
    audit = await open_log()
    audit.record(entry(1, payload_bytes=len(payload), payload_sha256=digest))
    await audit.flush()
    assert (await audit.query(AuditFilter(request_id="req-1")))[0].payload_sha256 == digest
    await audit.stop()
    stored = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.name.startswith("audit.db"))
    assert digest.encode() in stored
    for secret in (payload, b"4111-1111-1111-1111", b"Ada Lovelace"):
        assert secret not in stored


async def test_entries_survive_a_restart(open_log, tmp_path: Path) -> None:
    first = await open_log()
    for n in range(3):
        first.record(entry(n))
    await first.stop()  # stop() writes what is still buffered
    second = await open_log()
    assert [e.request_id for e in await second.query(AuditFilter())] == ["req-2", "req-1", "req-0"]
    second.record(entry(3))
    await second.flush()
    assert rows_in(tmp_path / "audit.db") == 4


async def test_retention_deletes_old_rows_at_start_and_on_prune(open_log, tmp_path: Path) -> None:
    now = time.time()
    keep_all = await open_log(retention_days=365.0)
    keep_all.record(entry(1, time=now - 40 * DAY))
    keep_all.record(entry(2, time=now - 20 * DAY))
    keep_all.record(entry(3, time=now))
    await keep_all.stop()
    assert rows_in(tmp_path / "audit.db") == 3

    thirty = await open_log(retention_days=30.0)  # start() prunes
    assert [e.request_id for e in await thirty.query(AuditFilter())] == ["req-3", "req-2"]
    assert await thirty.prune(now=now + 15 * DAY) == 1  # req-2 is now 35 days old
    assert [e.request_id for e in await thirty.query(AuditFilter())] == ["req-3"]


async def test_writer_prunes_periodically(open_log, tmp_path: Path) -> None:
    audit = await open_log(retention_days=1.0, flush_interval=0.02, prune_interval=0.0)
    audit.record(entry(1, time=time.time() - 2 * DAY))
    audit.record(entry(2))
    await wait_for(lambda: audit.written == 2, what="both written")
    await wait_for(lambda: rows_in(tmp_path / "audit.db") == 1, what="the old row pruned by the writer")
    assert [e.request_id for e in await audit.query(AuditFilter())] == ["req-2"]


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"), ({"limit": "ten"}, "limit"), ({"limit": "-1"}, "limit"),
    ({"limit": "²"}, "limit"), ({"since": "yesterday"}, "since"), ({"since": "2024-05-01T10:00:00"}, "since"),
    ({"until": "1e9"}, "until"), ({"until": "nan"}, "until"), ({"since": "20", "until": "10"}, "until"),
    ({"capability": ""}, "capability"), ({"caller": "x" * 257}, "caller"), ({"capabilty": "order.read"}, "capabilty"),
])
async def test_bad_filters_answer_400_naming_the_field(open_log, serve, http, params, field) -> None:
    audit = await open_log()
    url = await serve(audit)
    status, body = await get(http, url, **params)
    assert status == 400
    assert body["error"] == "invalid_field" and body["field"] == field and body["message"]


async def test_repeated_filter_answers_400(open_log, serve, http) -> None:
    audit = await open_log()
    url = await serve(audit)
    async with http.get(f"{url}?caller=a&caller=b") as response:
        assert response.status == 400
        assert (await response.json())["field"] == "caller"


def test_parse_filters_defaults_and_values() -> None:
    assert parse_filters({}) == AuditFilter(limit=100)
    assert parse_filters({"since": "1714557600", "until": "2024-05-01T12:00:00+02:00", "limit": "1000"}) == \
        AuditFilter(since=1714557600.0, until=1714557600.0, limit=1000)
    with pytest.raises(FilterError) as refused:
        parse_filters({"trace": "t1"})
    assert refused.value.field == "trace"


async def test_full_buffer_drops_and_counts_without_blocking(open_log, tmp_path: Path, caplog) -> None:
    audit = await open_log(batch_size=5, max_buffer=5, flush_interval=60.0)
    for n in range(8):
        audit.record(entry(n))
    assert audit.pending == 5 and audit.dropped == 3
    with caplog.at_level(logging.WARNING, logger="agentreach.router.audit"):
        await audit.flush()
    assert [e.request_id for e in await audit.query(AuditFilter())] == [f"req-{n}" for n in (4, 3, 2, 1, 0)]
    warnings = [r for r in caplog.records if r.getMessage() == "audit buffer full; entries dropped"]
    assert len(warnings) == 1 and warnings[0].dropped == 3 and warnings[0].dropped_total == 3
    audit.record(entry(9))  # room again after the write
    assert audit.pending == 1 and audit.dropped == 3


async def test_record_after_stop_is_counted_not_kept(open_log, tmp_path: Path) -> None:
    audit = await open_log()
    await audit.stop()
    audit.record(entry(1))
    assert audit.dropped == 1 and audit.pending == 0


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retention_days"):
        AuditLog(tmp_path / "a.db", retention_days=0)
    with pytest.raises(ValueError, match="batch_size"):
        AuditLog(tmp_path / "a.db", retention_days=1, batch_size=10, max_buffer=5)


def entry_of(**fields: object) -> AuditEntry:
    """call_entry for a call whose facts are these defaults, overridden by ``fields``."""
    facts: dict[str, object] = {
        "started_at": 1000.0, "capability": "order.read", "request_id": "r1", "outcome": "success", "error_code": None,
        "latency_ms": 12.5, "caller_id": None, "caller_name": None, "auth_method": None, "tried": [],
        "trace_id": "t1", "parent_request_id": "r0", "payload_bytes": 42, "payload_sha256": None, "rule": None,
        "usage": None, "streamed": False, "chunks": 0, "chunk_bytes": 0}
    facts.update(fields)
    return call_entry(**facts)  # type: ignore[arg-type]


def test_call_entry_takes_the_last_attempts_instance() -> None:
    attempts = [AttemptTrace(instance=f"agent-{n}", endpoint="http://127.0.0.1:1/x", protocol="atp",
                             started_ms=0.0, elapsed_ms=1.0) for n in (1, 2)]
    made = entry_of(tried=attempts, outcome="degraded", caller_id="cl_a", caller_name="shop", auth_method="jwt",
                    payload_sha256="ab" * 32)
    assert made == AuditEntry(time=1000.0, capability="order.read", request_id="r1", outcome="degraded",
                              latency_ms=12.5, caller="cl_a", caller_name="shop", instance="agent-2",
                              trace_id="t1", parent_request_id="r0", error_code=None, payload_bytes=42,
                              payload_sha256="ab" * 32, auth_method="jwt")


@pytest.mark.parametrize(("code", "outcome"), [("FORBIDDEN", "refused"), ("TRUST_LEVEL_INSUFFICIENT", "refused"),
                                               ("UNAUTHENTICATED", "refused"), ("AGENT_ERROR", "failed")])
def test_call_entry_marks_auth_refusals(code: str, outcome: str) -> None:
    made = entry_of(outcome="failed", error_code=code)
    assert made.outcome == outcome and made.error_code == code and made.instance is None
