"""The write-ahead log's test helpers: open and replay a real log, write records, damage segment files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wal import ReplayReport, WriteAheadLog

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
