"""WAL snapshots and compaction: what a snapshot covers is removed, replay starts after it, and a damaged
snapshot falls back or refuses."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgspec
import pytest

from wal import WalCorruption, WriteAheadLog, format_inspection, inspect_wal
from wal.snapshot import write_snapshot
from wal_support import PAYLOAD, RECORD, flip_byte, open_log, replay, segments, write_records


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
