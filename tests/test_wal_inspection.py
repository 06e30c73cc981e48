"""`agentreach wal inspect`'s report: read from a real log without changing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from wal import WalError, format_inspection, inspect_wal
from wal_support import PAYLOAD, open_log, segments


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
    for earlier, later in zip(report.segments, report.segments[1:], strict=False):
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
