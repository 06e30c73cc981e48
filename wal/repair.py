"""Deciding what a damaged segment means at start-up, and repairing torn tails.

Only one kind of damage is expected after a crash: the last batch of the last
segment was being written when the process or machine died. That tail was
never acknowledged, so cutting it off loses nothing. Damage to a last segment
whose every record the snapshot already holds is harmless too (a crash came
between writing the snapshot and compacting): open() removes that segment.
Any other damage means acknowledged records may be gone, so it stops
start-up with WalCorruption.
"""

from __future__ import annotations

import logging
import os

import msgspec

from .decoder import SegmentScan, final_record_index
from .errors import WalCorruption
from .files import remove_files, truncate_durably

log = logging.getLogger("agentreach.wal")


class TailTruncation(msgspec.Struct, frozen=True):
    """A torn tail that open() cut off: where, how much, and why."""

    path: str
    offset: int
    bytes_dropped: int
    reason: str


def is_torn_tail(scan: SegmentScan, is_last: bool) -> bool:
    """Whether the scan's problem is an interrupted final write that may be cut off."""
    return scan.problem is not None and scan.problem.torn and is_last


def check_scan(scan: SegmentScan, is_last: bool) -> TailTruncation | None:
    """Truncate a torn tail of the last segment; raise WalCorruption for any other problem."""
    problem = scan.problem
    if problem is None:
        return None
    if not is_torn_tail(scan, is_last):
        raise WalCorruption(scan.path, problem.offset, describe(scan, is_last))
    return truncate_tail(scan)


def remove_covered(scan: SegmentScan, snapshot_index: int) -> None:
    """Delete a damaged segment the snapshot holds entirely, saying so."""
    assert scan.problem is not None
    remove_files(os.path.dirname(scan.path), [scan.path])
    log.warning(
        "removed damaged segment %s (byte offset %d: %s): every record in it is at or below snapshot index %d",
        scan.path,
        scan.problem.offset,
        scan.problem.reason,
        snapshot_index,
        extra={"wal_path": scan.path, "offset": scan.problem.offset, "reason": scan.problem.reason,
               "snapshot_index": snapshot_index},
    )


def covered_by_snapshot(scan: SegmentScan, is_last: bool, snapshot_index: int) -> bool:
    """Whether the scan's damage is in a last segment holding no record past the snapshot."""
    problem = scan.problem
    if problem is None or not is_last or snapshot_index == 0 or is_torn_tail(scan, is_last):
        return False
    final = final_record_index(scan.path, problem.offset)
    return final is not None and scan.first_index <= final <= snapshot_index


def describe(scan: SegmentScan, is_last: bool, snapshot_index: int = 0) -> str:
    """Explain a problem the way an operator needs it: what, and whether open() repairs it."""
    problem = scan.problem
    assert problem is not None
    if is_torn_tail(scan, is_last):
        return f"{problem.reason}; torn tail, open() cuts the last {scan.size - problem.offset} bytes"
    if covered_by_snapshot(scan, is_last, snapshot_index):
        return (f"{problem.reason}; every record in the segment is at or below snapshot index {snapshot_index}, "
                "open() removes the segment and starts from the snapshot")
    if not is_last:
        return f"{problem.reason}; in a segment that is not the last one"
    return problem.reason


def truncate_tail(scan: SegmentScan) -> TailTruncation:
    """Cut the segment back to its last good record and make the new length durable."""
    assert scan.problem is not None
    offset = scan.problem.offset
    truncate_durably(scan.path, offset)
    truncation = TailTruncation(
        path=scan.path,
        offset=offset,
        bytes_dropped=scan.size - offset,
        reason=scan.problem.reason,
    )
    log.warning(
        "truncated torn tail of %s at byte offset %d (%d bytes dropped): %s",
        scan.path,
        offset,
        truncation.bytes_dropped,
        truncation.reason,
        extra={
            "wal_path": scan.path,
            "offset": offset,
            "bytes_dropped": truncation.bytes_dropped,
            "reason": truncation.reason,
            "last_good_index": scan.last_index,
        },
    )
    return truncation
