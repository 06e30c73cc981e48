"""Reading segment files back: decode, verify and report the first problem.

Replay speed matters (a million records must come back in a few seconds), so
segments are read in large chunks and records are decoded with
struct.unpack_from and zlib.crc32 over memoryviews, without per-record reads.
The decoder only describes what it finds; repair.py decides what to do.
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Callable, Iterator

import msgspec

from .encoder import ALIGNMENT, HEADER, HEADER_SIZE

CHUNK_BYTES = 8 * 1024 * 1024

Apply = Callable[[int, bytes], None]


class Problem(msgspec.Struct, frozen=True):
    """The first undecodable record of a segment.

    `torn` means the damage looks like an interrupted write and no valid
    record follows it in the file: the record runs past the end of the file,
    or it fails its CRC with a whole sector of it still zero (the write never
    reached that sector, as in etcd's torn-write check). A CRC mismatch on a
    record that fits and has every sector written is corruption of a complete
    record: replay must refuse it, never cut it off.
    """

    offset: int
    reason: str
    torn: bool


class SegmentScan(msgspec.Struct, frozen=True):
    """What one pass over a segment found; `valid_bytes` ends at the last good record."""

    path: str
    first_index: int
    records: int
    valid_bytes: int
    size: int
    problem: Problem | None

    @property
    def last_index(self) -> int:
        """Index of the last good record, or first_index - 1 when there is none."""
        return self.first_index + self.records - 1


def scan_segment(path: str, first_index: int, apply: Apply) -> SegmentScan:
    """Decode `path`, calling apply(index, payload) for each good record in order.

    Records must carry consecutive indexes starting at `first_index`. Decoding
    stops at the first record that is incomplete, fails its CRC or breaks the
    index sequence; that record and everything after it are left uncalled.
    """
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        align = ALIGNMENT - 1
        expected = first_index
        base = 0
        buf = b""
        pos = 0
        # (offset, reason, whether to look for valid records after it, whether it may be a torn write)
        found: tuple[int, str, bool, bool] | None = None
        while True:
            n = len(buf)
            need = HEADER_SIZE
            view = memoryview(buf)
            while pos + HEADER_SIZE <= n:
                length, crc, index = unpack(buf, pos)
                end = pos + HEADER_SIZE + length
                following = (end + align) & ~align
                if following > n:
                    need = following - pos
                    if base + following > size:
                        found = (pos, f"record of {length} payload bytes runs past the end of the file", True, True)
                    break
                if crc32(view[pos + 8 : end]) != crc:
                    unwritten = has_unwritten_sector(view[pos:end], base + pos)
                    found = (pos, crc_reason(index, unwritten), True, unwritten)
                    break
                if index != expected:
                    found = (pos, f"record index {index} where {expected} was expected", False, False)
                    break
                apply(index, buf[pos + HEADER_SIZE : end])
                expected += 1
                pos = following
            view.release()
            if found is None and base + n == size and pos < n:
                found = (pos, f"partial record header ({n - pos} of {HEADER_SIZE} bytes)", True, True)
            if found is not None or base + n == size:
                break
            chunk = file.read(min(max(CHUNK_BYTES, need), size - base - n))
            if not chunk:
                size = base + n
            buf = buf[pos:] + chunk
            base += pos
            pos = 0
        problem = None
        if found is not None:
            offset, reason, damaged, torn = found
            offset += base
            if damaged:
                valid_at = find_valid_record(file, offset + ALIGNMENT, size)
                if valid_at is not None:
                    torn = False
                    reason += f"; a valid record follows at byte offset {valid_at}"
            problem = Problem(offset=offset, reason=reason, torn=torn)
        valid_bytes = base + pos
    return SegmentScan(
        path=path,
        first_index=first_index,
        records=expected - first_index,
        valid_bytes=valid_bytes,
        size=size,
        problem=problem,
    )


SECTOR_BYTES = 512


def has_unwritten_sector(record: memoryview, file_offset: int) -> bool:
    """Whether some sector-aligned piece of `record` (at `file_offset` in its file) is all zero bytes.

    A write cut short by a crash leaves the sectors it never reached zero-filled;
    a flipped bit in a complete record leaves none.
    """
    start = 0
    while start < len(record):
        stop = min(len(record), start + SECTOR_BYTES - (file_offset + start) % SECTOR_BYTES)
        if not any(record[start:stop]):
            return True
        start = stop
    return False


def crc_reason(index: int, unwritten: bool) -> str:
    """Why a record that fits in the file failed its CRC."""
    if unwritten:
        return f"CRC mismatch (header claims index {index}) in a record with a zero-filled sector"
    return f"CRC mismatch (header claims index {index}) in a complete record: it was damaged after it was written"


def find_valid_record(file: io.FileIO, start: int, size: int) -> int | None:
    """Offset of the first CRC-valid record at an aligned offset >= `start`, if any.

    A damaged record with valid records after it is mid-log corruption, not a
    torn tail; since its length field cannot be trusted, every aligned offset
    is probed. This only runs on the failure path.
    """
    if start + HEADER_SIZE > size:
        return None
    file.seek(start)
    found = next(valid_records(file.read(size - start)), None)
    return None if found is None else start + found[0]


def final_record_index(path: str, damage: int) -> int | None:
    """Index of the valid record that ends `path`, probing past the damage at byte `damage`.

    Records in a segment are written in index order, so when the file ends
    with a whole valid record, no record in it has a higher index. None when
    the file does not end that way (the damage may be in its last record).
    """
    with open(path, "rb", buffering=0) as file:
        data = file.read()
    final = None
    for _, index, following in valid_records(data, damage + ALIGNMENT):
        final = (index, following)
    return final[0] if final is not None and final[1] == len(data) else None


def valid_records(data: bytes, start: int = 0) -> Iterator[tuple[int, int, int]]:
    """(offset, index, end incl. padding) of each CRC-valid record in `data` from aligned offset `start` on:
    every aligned offset is probed, and a valid record is jumped over whole."""
    view = memoryview(data)
    pos = start
    while pos + HEADER_SIZE <= len(data):
        length, crc, index = HEADER.unpack_from(data, pos)
        end = pos + HEADER_SIZE + length
        if end <= len(data) and zlib.crc32(view[pos + 8 : end]) == crc:
            following = (end + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
            yield pos, index, following
            pos = following
        else:
            pos += ALIGNMENT
