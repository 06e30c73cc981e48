"""Start-up recovery: load the snapshot, replay the segments after it, repair the tail.

The same plan (which snapshot, which segments it covers) is used by
inspection.py, so what `agentreach wal inspect` shows is what open() will do.
"""

from __future__ import annotations

import logging
import time

import msgspec

from .decoder import Apply, scan_segment
from .errors import WalCorruption
from .repair import TailTruncation, check_scan, covered_by_snapshot, remove_covered
from .segment import SegmentFile, covered_count, create_segment, list_segments
from .snapshot import RejectedSnapshot, Snapshot, load_newest, remove_temporaries

log = logging.getLogger("agentreach.wal")


class ReplayReport(msgspec.Struct, frozen=True):
    """What open() found and did, for the start-up log line and for tests."""

    snapshot_index: int
    records_replayed: int
    last_index: int
    segments: int
    truncated: TailTruncation | None
    seconds: float


class Plan(msgspec.Struct, frozen=True):
    """The snapshot to start from, and the segments split by whether it covers them."""

    snapshot: Snapshot | None
    rejected: list[RejectedSnapshot]
    covered: list[SegmentFile]
    needed: list[SegmentFile]

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0


class Recovery(msgspec.Struct, frozen=True):
    """The report, plus the segment chain the writer continues from."""

    report: ReplayReport
    segments: list[SegmentFile]


def make_plan(directory: str) -> Plan:
    """Pick the newest valid snapshot and the segments that must be replayed after it."""
    snapshot, rejected = load_newest(directory)
    segments = list_segments(directory)
    count = covered_count(segments, snapshot.index) if snapshot else 0
    return Plan(snapshot=snapshot, rejected=rejected, covered=segments[:count], needed=segments[count:])


def sequence_gap(plan: Plan, position: int, previous_last: int) -> str | None:
    """Why needed segment `position` does not continue the log, or None if it does."""
    segment = plan.needed[position]
    if position > 0:
        if segment.first_index != previous_last + 1:
            return (f"segment name says first index {segment.first_index} "
                    f"but the previous segment ends at {previous_last}")
        return None
    if segment.first_index <= plan.snapshot_index + 1:
        return None
    reason = f"records {plan.snapshot_index + 1}..{segment.first_index - 1} are in no segment or snapshot"
    for rejected in plan.rejected:
        reason += f"; snapshot {rejected.path} is unusable ({rejected.reason}) and the segments it replaced are gone"
    return reason


def recover(directory: str, apply_snapshot: Apply, apply_record: Apply) -> Recovery:
    """Replay the log into the callbacks and leave it ready to append to."""
    started = time.perf_counter()
    remove_temporaries(directory)
    plan = make_plan(directory)
    snapshot_index = plan.snapshot_index
    for rejected in plan.rejected:
        log.warning(
            "ignoring unusable snapshot %s: %s",
            rejected.path,
            rejected.reason,
            extra={"wal_path": rejected.path, "reason": rejected.reason},
        )
    if plan.snapshot:
        apply_snapshot(plan.snapshot.index, plan.snapshot.data)

    last_index = snapshot_index
    replayed = 0
    truncated = None
    needed = list(plan.needed)
    for position, segment in enumerate(plan.needed):
        gap = sequence_gap(plan, position, last_index)
        if gap:
            raise WalCorruption(segment.path, 0, gap)
        apply = apply_record if segment.first_index > snapshot_index else _after(snapshot_index, apply_record)
        scan = scan_segment(segment.path, segment.first_index, apply)
        is_last = position == len(plan.needed) - 1
        if covered_by_snapshot(scan, is_last, snapshot_index):
            remove_covered(scan, snapshot_index)
            needed.pop()
            break
        truncated = check_scan(scan, is_last)
        replayed += max(0, scan.last_index - max(segment.first_index - 1, snapshot_index))
        last_index = scan.last_index

    segments = plan.covered + needed
    if not needed or last_index < snapshot_index:
        segments.append(create_segment(directory, snapshot_index + 1))
    last_index = max(last_index, snapshot_index)
    report = ReplayReport(
        snapshot_index=snapshot_index,
        records_replayed=replayed,
        last_index=last_index,
        segments=len(segments),
        truncated=truncated,
        seconds=time.perf_counter() - started,
    )
    log.info(
        "replayed write-ahead log: snapshot %d, %d records, last index %d",
        snapshot_index,
        replayed,
        last_index,
        extra={"wal_dir": directory, **msgspec.to_builtins(report)},
    )
    return Recovery(report=report, segments=segments)


def _after(snapshot_index: int, apply_record: Apply) -> Apply:
    """apply_record, skipping records the snapshot already contains."""

    def apply(index: int, payload: bytes) -> None:
        if index > snapshot_index:
            apply_record(index, payload)

    return apply
