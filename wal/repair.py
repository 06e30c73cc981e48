"""Deciding what a damaged segment means at start-up, and repairing torn tails.

Only one kind of damage is expected after a crash: the last batch of the last
segment was being written when the process or machine died. That tail was
never acknowledged, so cutting it off loses nothing. Any other damage means
acknowledged records may be gone, so it stops start-up with WalCorruption.
"""

from __future__ import annotations

import logging

import msgspec

from .decoder import SegmentScan
from .errors import WalCorruption
from .files import truncate_durably

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


def describe(scan: SegmentScan, is_last: bool) -> str:
    """Explain a problem the way an operator needs it: what, and whether open() repairs it."""
    problem = scan.problem
    assert problem is not None
    if is_torn_tail(scan, is_last):
        return f"{problem.reason}; torn tail, open() cuts the last {scan.size - problem.offset} bytes"
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
