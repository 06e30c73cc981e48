"""WAL segments: records roll over into new segment files and replay across them; a damaged or missing
segment that is not the last is refused; offsets are absolute in segments larger than a read chunk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from wal import WalCorruption
from wal_support import RECORD, cut, flip_byte, open_log, replay, segments, write_records


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
