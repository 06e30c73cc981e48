"""Storage that fails loudly and recovers by itself, and a data dir nobody else can read.

A full disk is a real tmpfs of a few megabytes and a read-only one a real read-only bind mount,
each inside a private mount namespace (`unshare --mount`, as root: the CI runs as root) around a
real `agentreach registry` process; the test reaches into that namespace through /proc/PID/root.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp

from conftest import registration, wait_for
from sdk_support import free_port
from storage_support import AGENTREACH, NAMESPACE, ROOT, fill, registry_child, start_logged
from wal import WriteAheadLog


async def register(http: aiohttp.ClientSession, url: str, agent_id: str) -> tuple[int, dict]:
    async with http.post(f"{url}/register", json=registration(agent_id, f"cap.{agent_id}")) as response:
        return response.status, await response.json()


async def healthz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(f"{url}/healthz") as response:
        return response.status, await response.json()


async def test_full_disk_answers_503_reports_unhealthy_and_recovers_by_itself(tmp_path, http, start_registry):
    small = tmp_path / "small"  # an 8 MiB tmpfs, mounted over this directory in the registry's namespace only
    small.mkdir()
    kept = tmp_path / "kept"  # where the namespace's shell copies the data dir when the registry exits
    script = ('mount -t tmpfs -o size=8m tmpfs "$1" && "$2" -m agentreach.cli registry --port 0 --data-dir "$1/data" '
              '--auth off; cp -a "$1/data" "$3"')
    running = await asyncio.to_thread(start_logged, [*NAMESPACE, script, "sh", str(small), sys.executable, str(kept)],
                                      ready="registry listening")
    url, shell = running.url, running.process.pid
    try:
        acknowledged = set()
        for n in range(5):
            assert (await register(http, url, f"a{n}"))[0] == 200
            acknowledged.add(f"a{n}")
        assert (await healthz(http, url))[0] == 200

        filler = Path(f"/proc/{shell}/root{small}/filler")
        await asyncio.to_thread(fill, filler)
        refused = None
        for n in range(200):  # the segment's last page may still hold a few records
            status, body = await register(http, url, f"b{n}")
            if status != 200:
                refused = (f"b{n}", status, body)
                break
            acknowledged.add(f"b{n}")
        assert refused is not None, "the registry kept acknowledging changes on a full disk"
        agent_id, status, body = refused
        assert status == 503
        assert body["error"] == "storage_unavailable" and body["field"] is None
        assert "No space left on device" in body["message"]

        status, health = await healthz(http, url)
        assert status == 503, health
        assert health["status"] == "unavailable" and health["error"] == "storage_unavailable"
        assert "No space left on device" in health["message"]
        assert (await register(http, url, "c0"))[0] == 503  # refused at once while the disk is full
        async with http.get(f"{url}/agents") as response:
            listed = {agent["agent_id"] for agent in (await response.json())["agents"]}
        assert listed == acknowledged  # nothing refused is half-applied

        filler.unlink()
        await wait_for(lambda: _ok(http, url), timeout=20, what="the registry to report healthy again")
        assert (await register(http, url, agent_id))[0] == 200
        acknowledged.add(agent_id)
        logged = [event["event"] for event in running.events("agentreach.wal")]
        assert any(event.startswith("write-ahead log cannot write") for event in logged)
        assert any(event.startswith("write-ahead log writable again") for event in logged)
    finally:
        os.kill(registry_child(shell), signal.SIGTERM)
        assert await asyncio.to_thread(running.process.wait, 20) == 0
    # Every acknowledged change, and nothing else, is in the log the registry left behind.
    restarted = await start_registry(kept)
    assert restarted.replay.truncated is None
    assert {agent.agent_id for agent in restarted.registry.agents()} == acknowledged


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    return (await healthz(http, url))[0] == 200


READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1"'
FULL = 'mount -t tmpfs -o size=1m tmpfs "$1" && (cat /dev/zero > "$1/filler"; true)'


def _start_on(mount: str, data_dir: Path) -> subprocess.CompletedProcess:
    """`agentreach registry` on `data_dir`, its parent made read-only or full in a private mount namespace."""
    script = f'{mount} && exec "$2" -m agentreach.cli registry --port 0 --data-dir "$1/data"'
    return subprocess.run([*NAMESPACE, script, "sh", str(data_dir.parent), sys.executable], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


async def test_start_on_an_unusable_data_dir_refuses_with_one_line(tmp_path, start_registry):
    existing = tmp_path / "existing" / "data"
    server = await start_registry(existing)
    await server.stop()
    for mount, data_dir, cause in ((READ_ONLY, tmp_path / "fresh" / "data", "Read-only file system"),
                                   (READ_ONLY, existing, "Read-only file system"),
                                   (FULL, tmp_path / "full" / "data", "No space left on device")):
        data_dir.parent.mkdir(exist_ok=True)
        done = await asyncio.to_thread(_start_on, mount, data_dir)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        [line] = [line for line in done.stderr.splitlines() if "refusing to start" in line]
        assert line.startswith("agentreach: refusing to start:") and cause in line
        if mount == READ_ONLY:
            assert f"cannot use the write-ahead log directory {data_dir}" in line


def _modes(data_dir: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(data_dir.stat().st_mode)}
    for path in data_dir.rglob("*"):
        found[str(path.relative_to(data_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return found


async def test_data_dir_is_private_under_umask_022_and_a_loose_one_is_warned_about(tmp_path):
    data_dir = tmp_path / "mesh" / "data"
    ports = [str(free_port()) for _ in range(3)]
    running = await asyncio.to_thread(
        start_logged, [*AGENTREACH, "up", "--data-dir", str(data_dir), "--registry-port", ports[0],
                       "--router-port", ports[1], "--console-port", ports[2], "--auth", "on"],
        ready="console listening", umask=0o022)
    try:
        modes = _modes(data_dir)
    finally:
        running.process.terminate()
        assert await asyncio.to_thread(running.process.wait, 20) == 0
    for expected in (".", "wal", "wal/LOCK", "wal/00000000000000000001.seg", "admin.key", "audit.db", "console.db"):
        assert expected in modes, sorted(modes)
    loose = {path: f"{mode:04o}" for path, mode in modes.items()
             if mode != (0o700 if (data_dir / path).is_dir() else 0o600)}
    assert loose == {}
    assert running.events("agentreach.storage") == []

    segment = data_dir / "wal" / "00000000000000000001.seg"
    data_dir.chmod(0o755)
    segment.chmod(0o644)
    (data_dir / "wal" / "LOCK").chmod(0o640)
    (data_dir / "audit.db").chmod(0o644)
    again = await asyncio.to_thread(start_logged, [*AGENTREACH, "registry", "--port", "0", "--data-dir", str(data_dir)],
                                    ready="registry listening", umask=0o022)
    again.process.terminate()
    assert await asyncio.to_thread(again.process.wait, 20) == 0
    warnings = {event["path"]: event for event in again.events("agentreach.storage")}
    assert set(warnings) == {str(data_dir), f"{data_dir}/wal/*", f"{data_dir}/audit.db*"}
    assert warnings[str(data_dir)]["fix"] == f"chmod 700 {data_dir}"
    assert warnings[f"{data_dir}/wal/*"]["fix"] == f"chmod 600 {data_dir}/wal/*"
    assert warnings[f"{data_dir}/wal/*"]["paths"] == 2
    assert all(event["level"] == "warning" for event in warnings.values())



async def test_segments_snapshots_and_the_lock_are_private_whatever_the_umask(tmp_path):
    wal_dir = tmp_path / "data" / "wal"
    previous = os.umask(0)  # the loosest umask: every mode given to mkdir/open is kept as given
    try:
        log = WriteAheadLog(wal_dir, segment_bytes=256)
        log.open(lambda index, data: None, lambda index, payload: None)
        for _ in range(20):
            await log.append(b"x" * 100)
        await log.snapshot(10, b"state")
        await log.close()
    finally:
        os.umask(previous)
    modes = _modes(tmp_path / "data")
    assert {"wal/LOCK", "wal/snapshot-00000000000000000010.snap"} <= set(modes) and len(modes) > 5
    assert {path: f"{mode:04o}" for path, mode in modes.items()
            if mode != (0o700 if (tmp_path / "data" / path).is_dir() else 0o600)} == {}
