"""Snapshot files: the full registry state through one index, with its own CRC.

Layout of ``snapshot-<index>.snap``:

    offset 0   8 bytes  magic b"ARSNAP01"
    offset 8   u64      index the state is complete through
    offset 16  u64      data length
    offset 24  u32      CRC32 over bytes 8..24 (index, length) followed by the data
    offset 28  u32      zero
    offset 32  data

A snapshot is written to a temporary name, fsynced, renamed and the directory
fsynced, so a crash leaves either the old set of snapshots or the new one.
"""

from __future__ import annotations

import os
import re
import struct
import zlib

import msgspec

from .files import fsync_dir, remove_files, write_all
from .private import open_private

MAGIC = b"ARSNAP01"
HEADER = struct.Struct("<8sQQII")
_COVERED = struct.Struct("<QQ")
_NAME = re.compile(r"^snapshot-(\d{20})\.snap$")
TEMP_SUFFIX = ".tmp"


class SnapshotFile(msgspec.Struct, frozen=True):
    index: int
    path: str


class Snapshot(msgspec.Struct, frozen=True):
    """A verified snapshot, ready to hand to apply_snapshot."""

    index: int
    path: str
    data: bytes


class RejectedSnapshot(msgspec.Struct, frozen=True):
    path: str
    reason: str


def snapshot_name(index: int) -> str:
    return f"snapshot-{index:020d}.snap"


def list_snapshots(directory: str) -> list[SnapshotFile]:
    """Snapshots in `directory`, newest first."""
    found = []
    for name in os.listdir(directory):
        match = _NAME.match(name)
        if match:
            found.append(SnapshotFile(int(match.group(1)), os.path.join(directory, name)))
    found.sort(key=lambda snapshot: snapshot.index, reverse=True)
    return found


def write_snapshot(directory: str, index: int, data: bytes) -> SnapshotFile:
    """Durably write the snapshot for `index`, replacing any file of that name atomically."""
    final = os.path.join(directory, snapshot_name(index))
    temp = final + TEMP_SUFFIX
    crc = zlib.crc32(data, zlib.crc32(_COVERED.pack(index, len(data))))
    fd = open_private(temp, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, HEADER.pack(MAGIC, index, len(data), crc, 0))
        write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.remove(temp)  # a full disk must not also keep a half snapshot's space
        raise
    finally:
        os.close(fd)
    os.rename(temp, final)
    fsync_dir(directory)
    return SnapshotFile(index, final)


def read_snapshot(snapshot: SnapshotFile) -> Snapshot:
    """Read and verify one snapshot; raises ValueError saying what is wrong."""
    with open(snapshot.path, "rb") as file:
        raw = file.read()
    if len(raw) < HEADER.size:
        raise ValueError(f"file is {len(raw)} bytes, shorter than the {HEADER.size}-byte header")
    magic, index, length, crc, _ = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}")
    if index != snapshot.index:
        raise ValueError(f"header says index {index} but the name says {snapshot.index}")
    if len(raw) != HEADER.size + length:
        raise ValueError(f"header says {length} data bytes but the file holds {len(raw) - HEADER.size}")
    view = memoryview(raw)
    if zlib.crc32(view[HEADER.size :], zlib.crc32(view[8 : 8 + _COVERED.size])) != crc:
        raise ValueError("CRC mismatch")
    return Snapshot(index=index, path=snapshot.path, data=raw[HEADER.size :])


def load_newest(directory: str) -> tuple[Snapshot | None, list[RejectedSnapshot]]:
    """The newest snapshot that verifies, plus every newer one that did not."""
    rejected: list[RejectedSnapshot] = []
    for candidate in list_snapshots(directory):
        try:
            return read_snapshot(candidate), rejected
        except (ValueError, OSError) as exc:
            rejected.append(RejectedSnapshot(candidate.path, str(exc)))
    return None, rejected


def remove_snapshots_before(directory: str, index: int) -> None:
    """Delete snapshots older than `index` once the one at `index` is durable."""
    remove_files(directory, [snapshot.path for snapshot in list_snapshots(directory) if snapshot.index < index])


def remove_temporaries(directory: str) -> None:
    """Delete half-written snapshot files left by a crash during write_snapshot."""
    names = os.listdir(directory)
    temporaries = [name for name in names if name.startswith("snapshot-") and name.endswith(TEMP_SUFFIX)]
    remove_files(directory, [os.path.join(directory, name) for name in temporaries])
