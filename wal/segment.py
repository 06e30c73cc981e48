"""Segment files: naming, listing, creating, and appending to the active one.

A segment is named after the index of its first record, zero-padded to 20
digits (``00000000000000000001.seg``), so lexical order is log order and a
missing range is visible in a directory listing.
"""

from __future__ import annotations

import contextlib
import os
import re

import msgspec

from .files import fsync_dir, write_all
from .private import open_private

SUFFIX = ".seg"
_NAME = re.compile(r"^(\d{20})" + re.escape(SUFFIX) + "$")


class SegmentFile(msgspec.Struct, frozen=True):
    """A segment on disk, known by the first index its name promises."""

    first_index: int
    path: str


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}{SUFFIX}"


def list_segments(directory: str) -> list[SegmentFile]:
    """Segments in `directory`, oldest first."""
    found = []
    for name in os.listdir(directory):
        match = _NAME.match(name)
        if match:
            found.append(SegmentFile(int(match.group(1)), os.path.join(directory, name)))
    found.sort(key=lambda segment: segment.first_index)
    return found


def create_segment(directory: str, first_index: int) -> SegmentFile:
    """Create an empty segment and make its directory entry durable before use."""
    path = os.path.join(directory, segment_name(first_index))
    fd = open_private(path, os.O_WRONLY | os.O_EXCL)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return SegmentFile(first_index, path)


def replace_segment(directory: str, first_index: int) -> SegmentFile:
    """create_segment, first removing a file of that name left by a failed write.

    Such a file holds no acknowledged record: it is the empty segment whose
    first write failed, or one a failed rollover created but never used.
    """
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, segment_name(first_index)))
    return create_segment(directory, first_index)


class ActiveSegment:
    """The one segment being appended to; every write is followed by fdatasync.

    `size` counts synced bytes only: after a failed write or sync it is where
    the segment must be cut back to.
    """

    def __init__(self, segment: SegmentFile) -> None:
        self._fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
        self.size = os.fstat(self._fd).st_size

    def write_durably(self, data: bytes) -> None:
        """Append `data` and return only once it is on stable storage."""
        write_all(self._fd, data)
        os.fdatasync(self._fd)
        self.size += len(data)

    def close(self) -> None:
        os.close(self._fd)


def covered_count(segments: list[SegmentFile], index: int) -> int:
    """How many leading segments hold only records <= `index`.

    A segment's last record is one before the next segment's first, so this
    needs no reading; the last segment never counts, it may still grow.
    """
    count = 0
    while count + 1 < len(segments) and segments[count + 1].first_index <= index + 1:
        count += 1
    return count
