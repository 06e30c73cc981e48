"""Tests for the write-ahead log (wal/): real files, real fsync, real crashes.

Corruption is made by editing segment files on disk; crashes by SIGKILL of a
child process; write failures by a real RLIMIT_FSIZE in a child process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from wal import (
    ReplayReport,
    TailTruncation,
    WalCorruption,
    WalError,
    WriteAheadLog,
    format_inspection,
    inspect_wal,
)
from wal.encoder import encode_batch
from wal.snapshot import write_snapshot

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = b"p" * 100
RECORD = 120  # 16-byte header + 100-byte payload, padded to a multiple of 8


class Replayed:
    """Collects what open() hands to the callbacks."""

    def __init__(self) -> None:
        self.snapshot: tuple[int, bytes] | None = None
        self.records: list[tuple[int, bytes]] = []

    def apply_snapshot(self, index: int, data: bytes) -> None:
        assert self.snapshot is None, "apply_snapshot must be called at most once"
        self.snapshot = (index, data)

    def apply_record(self, index: int, payload: bytes) -> None:
        self.records.append((index, payload))

    @property
    def indexes(self) -> list[int]:
        return [index for index, _ in self.records]


def open_log(directory: Path, **options) -> tuple[WriteAheadLog, ReplayReport, Replayed]:
    replayed = Replayed()
    log = WriteAheadLog(directory, **options)
    report = log.open(replayed.apply_snapshot, replayed.apply_record)
    return log, report, replayed


async def replay(directory: Path) -> tuple[ReplayReport, Replayed]:
    """Open, collect the replay, close."""
    log, report, replayed = open_log(directory)
    await log.close()
    return report, replayed


async def write_records(directory: Path, count: int, **options) -> None:
    log, _, _ = open_log(directory, **options)
    for _ in range(count):
        await log.append(PAYLOAD)
    await log.close()


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def cut(path: Path, size: int) -> None:
    os.truncate(path, size)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def wal_dir(data_dir: Path) -> Path:
    return data_dir / "wal"


# --- appending and replay -------------------------------------------------------------------


async def test_round_trip_across_restarts_and_rollovers(wal_dir: Path) -> None:
    payloads = [bytes([n % 251]) * (n * 37 % 700) for n in range(300)] + [b"", b"z" * 10_000]
    log, report, replayed = open_log(wal_dir, segment_bytes=4096)
    assert (report.snapshot_index, report.records_replayed, report.last_index, report.truncated) == (0, 0, 0, None)
    assert log.last_index == 0 and replayed.records == []
    first_half = [await log.append(payload) for payload in payloads[:150]]
    assert first_half == list(range(1, 151))
    await log.close()

    log, report, replayed = open_log(wal_dir, segment_bytes=4096)
    assert replayed.records == list(enumerate(payloads[:150], 1))
    assert report.last_index == log.last_index == 150 and report.records_replayed == 150
    assert report.segments == len(segments(wal_dir)) > 3
    second_half = [await log.append(payload) for payload in payloads[150:]]
    assert second_half == list(range(151, len(payloads) + 1))
    await log.close()

    report, replayed = await replay(wal_dir)
    assert replayed.records == list(enumerate(payloads, 1))
    firsts = [int(path.stem) for path in segments(wal_dir)]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    assert report.last_index == len(payloads)


async def test_group_commit_batches_concurrent_appends(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir)

    async def writer(number: int) -> list[tuple[int, bytes]]:
        done = []
        for k in range(5):
            payload = f"writer-{number}-{k}".encode()
            done.append((await log.append(payload), payload))
        return done

    results = [pair for batch in await asyncio.gather(*(writer(n) for n in range(64))) for pair in batch]
    assert sorted(index for index, _ in results) == list(range(1, 321))
    stats = log.stats
    assert stats.records == 320
    assert stats.syncs == stats.batches < 320 / 8
    await log.close()

    _, replayed = await replay(wal_dir)
    assert sorted(replayed.records) == sorted(results)


async def test_without_group_commit_every_record_gets_its_own_sync(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir, group_commit=False)
    indexes = await asyncio.gather(*(log.append(f"r{n}".encode()) for n in range(64)))
    assert sorted(indexes) == list(range(1, 65))
    assert log.stats.syncs == log.stats.batches == log.stats.records == 64
    await log.close()
    _, replayed = await replay(wal_dir)
    assert replayed.indexes == list(range(1, 65))


async def test_on_commit_sees_index_order_on_the_loop_thread_before_append_returns(wal_dir: Path) -> None:
    committed: dict[int, bytes] = {}
    order: list[int] = []
    loop_thread = threading.get_ident()

    def on_commit(index: int, payload: bytes) -> None:
        assert threading.get_ident() == loop_thread
        committed[index] = payload
        order.append(index)

    log, _, _ = open_log(wal_dir, on_commit=on_commit)

    async def writer(number: int) -> None:
        for k in range(10):
            payload = f"{number}:{k}".encode()
            index = await log.append(payload)
            assert committed[index] == payload

    await asyncio.gather(*(writer(n) for n in range(16)))
    assert order == list(range(1, 161))
    await log.close()


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
        "committed": list(range(1, 11)) + [11],
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


async def test_on_commit_failure_stops_the_log(wal_dir: Path) -> None:
    def on_commit(index: int, payload: bytes) -> None:
        if payload == b"poison":
            raise RuntimeError("registry could not apply")

    log, _, _ = open_log(wal_dir, on_commit=on_commit)
    assert await log.append(b"fine") == 1
    with pytest.raises(WalError, match="on_commit raised") as raised:
        await log.append(b"poison")
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(WalError, match="stopped"):
        await log.append(b"after")
    await log.close()
    _, replayed = await replay(wal_dir)
    assert replayed.records == [(1, b"fine"), (2, b"poison")]


async def test_misuse_is_refused(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir)
    with pytest.raises(WalError, match="already open"):
        open_log(wal_dir)
    with pytest.raises(WalError, match="only once"):
        log.open(Replayed().apply_snapshot, Replayed().apply_record)
    with pytest.raises(TypeError):
        await log.append("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await log.snapshot(1, b"state")
    await log.close()
    with pytest.raises(WalError, match="closed"):
        await log.append(b"late")
    with pytest.raises(WalError, match="not been called"):
        await WriteAheadLog(wal_dir).append(b"early")
    await replay(wal_dir)


# --- torn tails and corruption -------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "good_records", "dropped"),
    [
        ("partial header", 9, 10),
        ("partial payload", 9, 16 + 40),
        ("a sector of the last record never written", 10, 1016),
        ("zeroed space after the last record", 10, 4096),
    ],
)
async def test_torn_tail_is_truncated_reported_and_appends_continue(
    wal_dir: Path, caplog: pytest.LogCaptureFixture, damage: str, good_records: int, dropped: int
) -> None:
    await write_records(wal_dir, 10)
    [segment] = segments(wal_dir)
    last = 9 * RECORD
    if damage == "partial header":
        cut(segment, last + 10)
    elif damage == "partial payload":
        cut(segment, last + 16 + 40)
    elif damage == "a sector of the last record never written":
        record = bytearray(encode_batch(11, [b"q" * 1000]))  # at offsets 1200..2216
        record[1536 - 1200 : 2048 - 1200] = bytes(512)
        with open(segment, "ab") as file:
            file.write(record)
    else:
        with open(segment, "ab") as file:
            file.write(bytes(4096))
    offset = good_records * RECORD

    with caplog.at_level(logging.WARNING, logger="agentreach.wal"):
        log, report, replayed = open_log(wal_dir)
    truncated = report.truncated
    assert isinstance(truncated, TailTruncation)
    assert (truncated.path, truncated.offset, truncated.bytes_dropped) == (str(segment), offset, dropped)
    assert segment.stat().st_size == offset
    assert replayed.indexes == list(range(1, good_records + 1))
    [warning] = [record for record in caplog.records if record.name == "agentreach.wal" and record.levelno == logging.WARNING]
    assert (warning.wal_path, warning.offset, warning.bytes_dropped) == (str(segment), offset, dropped)

    assert await log.append(b"after repair") == good_records + 1
    await log.close()
    report, replayed = await replay(wal_dir)
    assert report.truncated is None
    assert replayed.indexes == list(range(1, good_records + 2))
    assert replayed.records[-1] == (good_records + 1, b"after repair")


@pytest.mark.parametrize("offset", [9 * RECORD + 16 + 50, 9 * RECORD + 5, 9 * RECORD + 9])
async def test_flipped_byte_in_the_last_complete_record_is_refused_not_dropped(wal_dir: Path, offset: int) -> None:
    await write_records(wal_dir, 10)
    [segment] = segments(wal_dir)
    flip_byte(segment, offset)
    size = segment.stat().st_size

    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert (raised.value.path, raised.value.offset) == (str(segment), 9 * RECORD)
    assert "complete record" in raised.value.reason and segment.name in str(raised.value)
    assert segment.stat().st_size == size


@pytest.mark.parametrize("field", ["payload byte", "length field"])
async def test_damaged_record_followed_by_valid_ones_raises(wal_dir: Path, field: str) -> None:
    await write_records(wal_dir, 10)
    [segment] = segments(wal_dir)
    offset = 3 * RECORD
    flip_byte(segment, offset + 16 + 5 if field == "payload byte" else offset + 2)
    size = segment.stat().st_size

    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert segment.name in str(raised.value) and str(offset) in str(raised.value)
    assert (raised.value.path, raised.value.offset) == (str(segment), offset)
    assert "valid record follows" in raised.value.reason
    assert segment.stat().st_size == size


@pytest.mark.parametrize("damage", ["bad CRC", "cut short"])
async def test_damage_at_the_end_of_a_segment_that_is_not_the_last_raises(wal_dir: Path, damage: str) -> None:
    await write_records(wal_dir, 30, segment_bytes=1024)
    first, *rest = segments(wal_dir)
    assert len(rest) >= 2 and rest[0].name == "00000000000000000010.seg"
    offset = 8 * RECORD
    if damage == "bad CRC":
        flip_byte(first, offset + 16 + 1)
    else:
        cut(first, offset + 30)

    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert first.name in str(raised.value) and f"offset {offset}" in str(raised.value)
    assert "not the last" in raised.value.reason


async def test_missing_segment_breaks_the_sequence(wal_dir: Path) -> None:
    await write_records(wal_dir, 30, segment_bytes=1024)
    _, middle, following, *_ = segments(wal_dir)
    middle.unlink()
    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert (raised.value.path, raised.value.offset) == (str(following), 0)
    assert "previous segment ends at 9" in str(raised.value)


async def test_valid_record_with_the_wrong_index_is_not_a_torn_tail(wal_dir: Path) -> None:
    await write_records(wal_dir, 10)
    [segment] = segments(wal_dir)
    with open(segment, "ab") as file:
        file.write(encode_batch(15, [PAYLOAD]))
    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert raised.value.offset == 10 * RECORD
    assert "record index 15 where 11 was expected" in str(raised.value)


async def test_segments_larger_than_a_read_chunk_replay_and_report_absolute_offsets(wal_dir: Path) -> None:
    record = 16 + 1000
    log, _, _ = open_log(wal_dir)
    for wave in range(9):
        await asyncio.gather(*(log.append(f"{wave * 1000 + n:04d}".encode() * 250) for n in range(1000)))
    await log.close()
    [segment] = segments(wal_dir)
    assert segment.stat().st_size == 9000 * record > 8 * 2**20

    _, replayed = await replay(wal_dir)
    assert replayed.indexes == list(range(1, 9001))
    assert all(payload == f"{index - 1:04d}".encode() * 250 for index, payload in replayed.records)

    flip_byte(segment, 8500 * record + 100)
    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert raised.value.offset == 8500 * record


# --- snapshots -----------------------------------------------------------------------------


async def test_snapshot_compacts_and_restart_replays_only_later_records(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir, segment_bytes=2048)
    for _ in range(200):
        await log.append(PAYLOAD)
    assert len(segments(wal_dir)) > 5
    await log.snapshot(200, b"state through 200")
    assert [path.name for path in segments(wal_dir)] == ["00000000000000000201.seg"]
    assert log.stats.snapshot_index == 200 and log.stats.segments == 1
    for n in range(50):
        await log.append(f"later {n}".encode())
    await log.close()
    interrupted = wal_dir / "snapshot-00000000000000000250.snap.tmp"
    interrupted.write_bytes(b"half a snapshot")

    log, report, replayed = open_log(wal_dir, segment_bytes=2048)
    assert replayed.snapshot == (200, b"state through 200")
    assert replayed.records == [(201 + n, f"later {n}".encode()) for n in range(50)]
    assert (report.snapshot_index, report.records_replayed, report.last_index) == (200, 50, 250)
    assert not interrupted.exists()
    await log.snapshot(230, b"state through 230")
    assert [path.name for path in wal_dir.glob("*.snap")] == ["snapshot-00000000000000000230.snap"]
    assert [path.name for path in segments(wal_dir)] == ["00000000000000000201.seg"]
    await log.close()

    report, replayed = await replay(wal_dir)
    assert replayed.snapshot == (230, b"state through 230")
    assert replayed.indexes == list(range(231, 251))


async def test_snapshot_during_concurrent_appends_loses_nothing(wal_dir: Path) -> None:
    state: dict[int, str] = {}
    reached = asyncio.Event()
    target = [0]

    def on_commit(index: int, payload: bytes) -> None:
        state[index] = payload.decode()
        if index >= target[0]:
            reached.set()

    log, _, _ = open_log(wal_dir, segment_bytes=4096, on_commit=on_commit)

    async def writer(number: int) -> None:
        for k in range(40):
            await log.append(f"{number}:{k}".encode())

    writers = asyncio.gather(*(writer(n) for n in range(16)))
    taken = []
    for target[0] in (100, 300, 500):
        reached.clear()
        await reached.wait()
        index = log.last_index
        await log.snapshot(index, msgspec.json.encode({i: p for i, p in state.items() if i <= index}))
        taken.append(index)
    await writers
    await log.close()
    assert taken == sorted(taken) and len(state) == 640

    rebuilt: dict[int, str] = {}

    def apply_snapshot(index: int, data: bytes) -> None:
        assert index == taken[-1]
        rebuilt.update({int(i): p for i, p in msgspec.json.decode(data).items()})

    def apply_record(index: int, payload: bytes) -> None:
        assert index > taken[-1] and index not in rebuilt
        rebuilt[index] = payload.decode()

    log = WriteAheadLog(wal_dir)
    report = log.open(apply_snapshot, apply_record)
    await log.close()
    assert rebuilt == state
    assert report.last_index == 640


async def test_corrupt_newest_snapshot_falls_back_when_segments_still_cover_it(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, _, _ = open_log(wal_dir, segment_bytes=2048)
    for _ in range(100):
        await log.append(PAYLOAD)
    await log.snapshot(50, b"state through 50")
    for _ in range(50):
        await log.append(PAYLOAD)
    await log.close()
    broken = wal_dir / "snapshot-00000000000000000120.snap"
    broken.write_bytes(b"not a snapshot")

    with caplog.at_level(logging.WARNING, logger="agentreach.wal"):
        report, replayed = await replay(wal_dir)
    assert replayed.snapshot == (50, b"state through 50")
    assert replayed.indexes == list(range(51, 151))
    assert report.last_index == 150
    assert any(broken.name in record.getMessage() for record in caplog.records)


async def test_corrupt_newest_snapshot_refuses_when_its_segments_are_gone(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir, segment_bytes=2048)
    for _ in range(100):
        await log.append(PAYLOAD)
    await log.snapshot(50, b"state through 50")
    older = wal_dir / "snapshot-00000000000000000050.snap"
    older_bytes = older.read_bytes()
    for _ in range(50):
        await log.append(PAYLOAD)
    await log.snapshot(150, b"state through 150")
    for _ in range(10):
        await log.append(PAYLOAD)
    await log.close()
    older.write_bytes(older_bytes)
    newest = wal_dir / "snapshot-00000000000000000150.snap"
    flip_byte(newest, newest.stat().st_size - 1)

    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    message = str(raised.value)
    assert newest.name in message and "CRC mismatch" in message and "51..150" in message


@pytest.mark.parametrize(
    ("snapshot_index", "damaged_record", "starts"),
    [(100, 50, True), (100, 100, False), (80, 50, False)],
    ids=["snapshot holds every record", "damage in the final record", "records past the snapshot"],
)
async def test_damage_the_snapshot_covers_is_removed_and_start_up_goes_on(
    wal_dir: Path, caplog: pytest.LogCaptureFixture, snapshot_index: int, damaged_record: int, starts: bool
) -> None:
    """A crash between writing a snapshot and compacting leaves segments the snapshot holds whole."""
    await write_records(wal_dir, 100)
    write_snapshot(str(wal_dir), snapshot_index, b"state")
    [segment] = segments(wal_dir)
    offset = (damaged_record - 1) * RECORD
    flip_byte(segment, offset + 16 + 7)

    if not starts:
        with pytest.raises(WalCorruption) as raised:
            open_log(wal_dir)
        assert (raised.value.path, raised.value.offset) == (str(segment), offset)
        assert segment.exists()
        return
    assert "open() removes the segment" in format_inspection(inspect_wal(wal_dir.parent))
    with caplog.at_level(logging.WARNING, logger="agentreach.wal"):
        log, report, replayed = open_log(wal_dir)
    assert replayed.snapshot == (100, b"state") and replayed.records == []
    assert (report.snapshot_index, report.last_index) == (100, 100)
    assert not segment.exists()
    [warning] = [record for record in caplog.records if record.name == "agentreach.wal"]
    assert (warning.wal_path, warning.offset, warning.snapshot_index) == (str(segment), offset, 100)
    assert await log.append(b"after") == 101
    await log.close()
    _, replayed = await replay(wal_dir)
    assert replayed.records == [(101, b"after")]


# --- crash safety --------------------------------------------------------------------------

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


# --- inspection ----------------------------------------------------------------------------


async def test_inspect_reports_a_real_log_without_changing_it(data_dir: Path, wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir, segment_bytes=2048)
    for _ in range(60):
        await log.append(PAYLOAD)
    await log.snapshot(20, b"s" * 33)
    for _ in range(40):
        await log.append(PAYLOAD)
    await log.close()
    last_segment = segments(wal_dir)[-1]
    with open(last_segment, "ab") as file:
        file.write(b"torn!!!")
    before = {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in wal_dir.iterdir()}

    report = inspect_wal(data_dir)

    assert {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in wal_dir.iterdir()} == before
    assert report.snapshot is not None
    assert (report.snapshot.file, report.snapshot.index, report.snapshot.bytes) == (
        "snapshot-00000000000000000020.snap",
        20,
        32 + 33,
    )
    assert report.last_index == 100
    names = [path.name for path in segments(wal_dir)]
    assert [info.file for info in report.segments] == names
    assert report.segments[0].first_index <= 21
    for earlier, later in zip(report.segments, report.segments[1:]):
        assert later.first_index == earlier.last_index + 1
    assert report.total_records == sum(info.records for info in report.segments)
    assert report.segments[-1].last_index == 100
    assert [info.problem is None for info in report.segments] == [True] * (len(names) - 1) + [False]
    assert "torn tail" in report.segments[-1].problem

    text = format_inspection(report)
    assert "snapshot-00000000000000000020.snap" in text and "torn tail" in text
    assert all(name in text for name in names)
    assert "Last index: 100" in text


def test_inspect_without_a_log_says_so(data_dir: Path) -> None:
    with pytest.raises(WalError, match="no write-ahead log"):
        inspect_wal(data_dir)
