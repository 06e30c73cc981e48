"""Repairing torn tails: a last record a crash left half-written is cut off and reported; damage that is
not a torn tail (a complete record, a record followed by valid ones, a wrong index) is refused, not dropped.

Corruption is made by editing segment files on disk."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from wal import TailTruncation, WalCorruption
from wal.encoder import encode_batch
from wal_support import PAYLOAD, RECORD, cut, flip_byte, open_log, replay, segments, write_records


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
    [warning] = [record for record in caplog.records
                 if record.name == "agentreach.wal" and record.levelno == logging.WARNING]
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


async def test_valid_record_with_the_wrong_index_is_not_a_torn_tail(wal_dir: Path) -> None:
    await write_records(wal_dir, 10)
    [segment] = segments(wal_dir)
    with open(segment, "ab") as file:
        file.write(encode_batch(15, [PAYLOAD]))
    with pytest.raises(WalCorruption) as raised:
        open_log(wal_dir)
    assert raised.value.offset == 10 * RECORD
    assert "record index 15 where 11 was expected" in str(raised.value)
