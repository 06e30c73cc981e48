"""The audit trail's writer process: every call keeps its row, a killed router loses at most its unsent
buffer (fewer than a batch), and a killed writer loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import textwrap
import threading
from pathlib import Path

import aiohttp
import pytest

from agentreach.cli import build_parser
from agentreach.knobs import router_settings
from conftest import wait_for
from router.audit import AuditLog
from router.audit_writer import use_wal
from router_support import StartMesh
from test_audit import entry, rows_in

CALLS = 10_000


def request_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT request_id FROM audit")]


def alive(pid: int) -> bool:
    """Running, and not a zombie (a zombie is dead too: its parent reaps it when it gets to it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped while read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_every_call_has_its_row_after_10000_calls(start_mesh: StartMesh, start_agent, http: aiohttp.ClientSession,
                                                        tmp_path: Path) -> None:
    mesh = await start_mesh(router_settings={"audit_path": tmp_path / "audit.db"})
    await mesh.add(await start_agent("echo-1"), "echo")
    pending = iter(range(CALLS))
    statuses: list[int] = []

    async def caller() -> None:
        for n in pending:
            async with http.post(f"{mesh.url}/atp", json={"capability": "echo", "payload": n,
                                                          "request_id": f"call-{n}"}) as response:
                await response.read()
                statuses.append(response.status)

    await asyncio.gather(*(caller() for _ in range(16)))
    assert statuses == [200] * CALLS
    await mesh.router_server.stop()  # writes what is still buffered
    kept = request_ids(tmp_path / "audit.db")
    assert len(kept) == CALLS and set(kept) == {f"call-{n}" for n in range(CALLS)}


# A router process of its own: batches of 100 handed over only when full (the interval is an hour).
# After 250 calls it has handed over two batches, which the writer may not have committed yet (its window
# is a second), and still holds 50 rows when it is killed.
ROUTER = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from router.audit import AuditLog
    from test_audit import entry

    async def main():
        audit = AuditLog(Path(sys.argv[1]), 30.0, batch_size=100, flush_interval=3600.0)
        await audit.start()
        for n in range(1, 251):
            audit.record(entry(n - 1))
            while audit.pending == 100:  # a full batch: wait until it is handed over, not for its commit
                await asyncio.sleep(0.001)
        print(json.dumps({"writer": audit.writer_pid, "handed_over": audit.unacknowledged + audit.written,
                          "pending": audit.pending}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


async def test_a_killed_router_loses_at_most_its_unsent_buffer(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    tests = Path(__file__).parent
    router = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ROUTER, str(path), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])})
    assert router.stdout is not None
    state = json.loads(await asyncio.wait_for(router.stdout.readline(), 30))
    assert (state["handed_over"], state["pending"]) == (200, 50)
    router.send_signal(signal.SIGKILL)
    await router.wait()
    # The writer sees its stdin close, commits every batch it was handed, acknowledged or not, and exits.
    await wait_for(lambda: not alive(state["writer"]), timeout=10, what="the writer to exit")
    assert sorted(request_ids(path)) == sorted(f"req-{n}" for n in range(200))  # lost: 50 < batch_size


async def test_batches_handed_over_together_are_committed_in_one_transaction(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.db", 30.0, batch_size=10, flush_interval=3600.0)
    await audit.start()
    try:
        for n in range(25):
            audit.record(entry(n))  # the 10th wakes the background hand-off, which takes all 25
        await wait_for(lambda: audit.written == 25, timeout=10, what="the rows committed")
        assert (audit.batches, audit.commits) == (3, 1)  # before: a transaction (and an fsync) per batch
        audit.record(entry(25))
        await audit.flush()  # commits at once, without waiting out the writer's window
        assert (audit.batches, audit.commits, rows_in(tmp_path / "audit.db")) == (4, 2, 26)
    finally:
        await audit.stop()


async def test_a_killed_writer_loses_no_row(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.db", 30.0, batch_size=10, flush_interval=3600.0)
    await audit.start()
    try:
        for n in range(5):
            audit.record(entry(n))
        await audit.flush()
        assert audit.writer_pid is not None
        os.kill(audit.writer_pid, signal.SIGKILL)
        await wait_for(lambda: not alive(audit.writer_pid), timeout=10, what="the writer to die")
        for n in range(5, 25):
            audit.record(entry(n))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await audit.flush()  # the ack never comes: the batches stay buffered, a new writer is started
        assert audit.pending == 20
        await audit.flush()
        assert sorted(request_ids(tmp_path / "audit.db")) == sorted(f"req-{n}" for n in range(25))
        assert audit.written == rows_in(tmp_path / "audit.db") == 25
    finally:
        await audit.stop()



async def test_the_batch_bound_is_the_routers_setting(start_mesh: StartMesh, tmp_path: Path) -> None:
    args = build_parser().parse_args(["router", "--registry", "http://127.0.0.1:1", "--data-dir", str(tmp_path),
                                      "--audit-batch-rows", "100"])
    settings = router_settings(args, 0, args.registry)
    assert settings.audit_batch_rows == 100
    mesh = await start_mesh(router_settings={"audit_path": tmp_path / "audit.db", "audit_batch_rows": 100})
    assert mesh.router_server.audit is not None and mesh.router_server.audit.batch_size == 100


async def test_a_writer_killed_before_stop_loses_no_row_and_stop_does_not_wait_out_the_interval(
        tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.db", 30.0, batch_size=10, flush_interval=3600.0)
    await audit.start()
    assert audit.writer_pid is not None
    os.kill(audit.writer_pid, signal.SIGKILL)
    await wait_for(lambda: not alive(audit.writer_pid), timeout=10, what="the writer to die")
    for n in range(5):
        audit.record(entry(n))
    await asyncio.wait_for(audit.stop(), 30)  # not the hour of the interval: the failed write is retried at once
    assert sorted(request_ids(tmp_path / "audit.db")) == [f"req-{n}" for n in range(5)]


async def test_a_flush_cancelled_while_waiting_for_its_ack_keeps_the_acks_in_step(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.db", 30.0, batch_size=10, flush_interval=3600.0)
    await audit.start()
    stopped = audit.writer_pid
    assert stopped is not None
    try:
        os.kill(stopped, signal.SIGSTOP)  # the writer takes the batch but cannot answer yet
        for n in range(5):
            audit.record(entry(n))
        flushing = asyncio.ensure_future(audit.flush())
        await wait_for(lambda: audit.pending == 0, timeout=10, what="the batch handed over")
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        # The batch is kept; the next flush (a new writer) writes it and waits for its own commit.
        assert audit.pending == 5
        audit.record(entry(5))
        await asyncio.wait_for(audit.flush(), 30)  # before: it took the stale ack's place, or waited forever
        assert set(request_ids(tmp_path / "audit.db")) == {f"req-{n}" for n in range(6)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)  # a failing run's teardown must not wait on it
        await audit.stop()


async def test_a_file_another_connection_is_reading_is_switched_to_wal_once_it_is_free(tmp_path: Path) -> None:
    """Switching a new file to WAL takes a lock SQLite does not wait for: a router worker that opened the
    audit file while another read it failed with "database is locked", and `up --workers 2` refused to
    start (seen in CI). The switch now retries until the reader lets go."""
    path = tmp_path / "audit.db"
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("CREATE TABLE t (x)")
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()  # a shared lock, held until COMMIT
    tries: list[str] = []
    opener = sqlite3.connect(path, timeout=0.05, isolation_level=None, check_same_thread=False)
    opener.set_trace_callback(tries.append)
    switching = threading.Thread(target=use_wal, args=(opener,))
    switching.start()
    await wait_for(lambda: len(tries) >= 2, what="the switch to be retried while the file is read")
    reader.execute("COMMIT")
    switching.join(timeout=10)
    assert not switching.is_alive()
    assert opener.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_switch_gives_up_after_its_patience(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("CREATE TABLE t (x)")
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        use_wal(sqlite3.connect(path, timeout=0.01, isolation_level=None), patience=0.1)


async def test_rows_the_audit_trail_could_not_keep_are_counted_in_metrics(start_mesh: StartMesh, start_agent,
                                                                          tmp_path: Path) -> None:
    mesh = await start_mesh(router_settings={"audit_path": tmp_path / "audit.db"})
    await mesh.add(await start_agent("echo-1"), "echo")
    assert (await mesh.call("echo", 1)).status == 200
    assert "agentreach_router_audit_dropped_rows_total 0.0" in await mesh.get("/metrics")
    audit = mesh.router.audit
    assert audit is not None
    await audit.stop()  # as at shutdown: what is recorded after is dropped, and counted
    assert (await mesh.call("echo", 2)).status == 200
    assert "agentreach_router_audit_dropped_rows_total 1.0" in await mesh.get("/metrics")
