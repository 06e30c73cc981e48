"""The WAL when the machine fails it: a write the disk refuses (a real RLIMIT_FSIZE in a child process) and
a SIGKILL while appending (every acknowledged append survives)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from wal_support import ROOT, open_log, replay

FAILING_WRITE = r"""
import asyncio, json, resource, signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from wal import WalUnavailable, WriteAheadLog

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
directory = Path(sys.argv[2])
committed = []

async def until(condition):
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)

async def main():
    log = WriteAheadLog(directory, on_commit=lambda index, payload: committed.append(index))
    log.open(lambda index, data: None, lambda index, payload: None)
    for _ in range(10):
        await log.append(b"a" * 100)
    [segment] = sorted(directory.glob("*.seg"))
    size = segment.stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 60, hard))
    results = await asyncio.gather(*(log.append(b"b" * 100) for _ in range(20)), return_exceptions=True)
    try:
        await log.append(b"c")
        refused = False
    except WalUnavailable:
        refused = True
    health = log.health
    # The half-written batch was cut off before its writers heard of the failure (a crash now replays
    # none of it); the repair cannot finish while the disk refuses writes.
    cut_at_once = segment.stat().st_size == size and log.stats.outages == 1
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    await until(lambda: log.health.writable)
    after = await log.append(b"d" * 100)
    await log.close()
    print(json.dumps({
        "committed": committed,
        "results": sorted({type(result).__name__ for result in results}),
        "causes": sorted({type(result.__cause__).__name__ for result in results}),
        "refused": refused,
        "cut_at_once": cut_at_once,
        "health": [health.writable, health.problem],
        "after": after,
        "segments": sorted(path.name for path in directory.glob("*.seg")),
    }))

asyncio.run(main())
"""


async def test_failed_write_is_refused_cut_back_and_repaired_when_the_disk_takes_writes_again(wal_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAILING_WRITE, str(ROOT), str(wal_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome == {
        "committed": [*list(range(1, 11)), 11],
        "results": ["WalUnavailable"],
        "causes": ["OSError"],
        "refused": True,
        "cut_at_once": True,
        "health": [False, "File too large"],
        "after": 11,
        "segments": ["00000000000000000001.seg", "00000000000000000011.seg"],
    }
    log, report, replayed = open_log(wal_dir)
    assert report.truncated is None  # nothing half-written was left behind for replay to misread
    assert replayed.records == [(n, b"a" * 100) for n in range(1, 11)] + [(11, b"d" * 100)]
    assert await log.append(b"next") == 12
    await log.close()


APPEND_FOREVER = r"""
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from wal import WriteAheadLog

async def main():
    log = WriteAheadLog(sys.argv[2], segment_bytes=16384)
    log.open(lambda index, data: None, lambda index, payload: None)

    async def writer(number):
        k = 0
        while True:
            payload = f"{number}:{k}"
            index = await log.append(payload.encode() * 8)
            sys.stdout.write(f"{index} {payload}\n")
            sys.stdout.flush()
            k += 1

    await asyncio.gather(*(writer(n) for n in range(8)))

asyncio.run(main())
"""


def read_acknowledgements(process: subprocess.Popen, wanted: int, deadline: float) -> dict[int, bytes]:
    """Complete 'index payload' lines printed by the child, until `wanted` or the deadline."""
    acknowledged: dict[int, bytes] = {}
    pending = b""
    fd = process.stdout.fileno()
    while len(acknowledged) < wanted and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            index, payload = line.split(b" ")
            acknowledged[int(index)] = payload * 8
    return acknowledged


async def test_every_acknowledged_append_survives_sigkill(wal_dir: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", APPEND_FOREVER, str(ROOT), str(wal_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        acknowledged = read_acknowledgements(process, wanted=20_000, deadline=time.monotonic() + 15)
    finally:
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
    assert len(acknowledged) >= 20_000, stderr.decode()

    report, replayed = await replay(wal_dir)
    recovered = dict(replayed.records)
    assert replayed.indexes == list(range(1, report.last_index + 1))
    assert {index: recovered[index] for index in acknowledged} == acknowledged
    assert report.segments > 1
