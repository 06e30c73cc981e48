"""Read-only inspection of a log for `agentreach wal inspect <data-dir>`.

It uses the same plan and checks as open() but never truncates, creates or
removes anything, so it is safe on a live log (where an append in flight may
show up as a torn tail).
"""

from __future__ import annotations

import os

import msgspec

from .decoder import SegmentScan, scan_segment
from .errors import WalError
from .repair import describe
from .replay import make_plan, sequence_gap

WAL_SUBDIR = "wal"


class SegmentInfo(msgspec.Struct, frozen=True):
    """One segment: `covered` means the snapshot holds all its records, so open() skips it."""

    file: str
    first_index: int
    last_index: int
    records: int
    bytes: int
    covered: bool
    problem: str | None


class SnapshotInfo(msgspec.Struct, frozen=True):
    file: str
    index: int
    bytes: int


class UnusableSnapshot(msgspec.Struct, frozen=True):
    file: str
    reason: str


class WalInspection(msgspec.Struct, frozen=True):
    directory: str
    segments: list[SegmentInfo]
    snapshot: SnapshotInfo | None
    unusable_snapshots: list[UnusableSnapshot]
    last_index: int
    total_records: int


def inspect_wal(data_dir: str | os.PathLike[str]) -> WalInspection:
    """Describe the log under `<data_dir>/wal` without modifying it."""
    directory = os.path.join(os.path.abspath(data_dir), WAL_SUBDIR)
    if not os.path.isdir(directory):
        raise WalError(f"no write-ahead log directory at {directory}")
    plan = make_plan(directory)
    infos = []
    for segment in plan.covered:
        scan = scan_segment(segment.path, segment.first_index, _ignore)
        infos.append(_info(scan, covered=True, problem=describe(scan, is_last=False) if scan.problem else None))
    last_index = plan.snapshot_index
    for position, segment in enumerate(plan.needed):
        scan = scan_segment(segment.path, segment.first_index, _ignore)
        problems = [sequence_gap(plan, position, last_index)]
        if scan.problem:
            problems.append(describe(scan, position == len(plan.needed) - 1, plan.snapshot_index))
        infos.append(_info(scan, covered=False, problem="; ".join(p for p in problems if p) or None))
        last_index = scan.last_index
    snapshot = None
    if plan.snapshot:
        snapshot = SnapshotInfo(
            file=os.path.basename(plan.snapshot.path),
            index=plan.snapshot.index,
            bytes=os.path.getsize(plan.snapshot.path),
        )
    return WalInspection(
        directory=directory,
        segments=infos,
        snapshot=snapshot,
        unusable_snapshots=[UnusableSnapshot(os.path.basename(r.path), r.reason) for r in plan.rejected],
        last_index=max(last_index, plan.snapshot_index),
        total_records=sum(info.records for info in infos),
    )


def format_inspection(report: WalInspection) -> str:
    """Render an inspection as a text table for a terminal."""
    lines = [f"Write-ahead log: {report.directory}"]
    if report.snapshot:
        snap = report.snapshot
        lines.append(f"Snapshot in use: {snap.file} (index {snap.index}, {snap.bytes:,} bytes)")
    else:
        lines.append("Snapshot in use: none")
    for unusable in report.unusable_snapshots:
        lines.append(f"Unusable snapshot: {unusable.file}: {unusable.reason}")
    rows = [("SEGMENT", "FIRST", "LAST", "RECORDS", "BYTES", "STATUS")]
    for info in report.segments:
        notes = ["covered by snapshot" if info.covered else None, info.problem]
        status = "; ".join(note for note in notes if note) or "ok"
        last = str(info.last_index) if info.records else "-"
        rows.append((info.file, str(info.first_index), last, f"{info.records:,}", f"{info.bytes:,}", status))
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    for row in rows:
        numbers = [cell.rjust(width) for cell, width in zip(row[1:5], widths[1:], strict=True)]
        lines.append("  ".join([row[0].ljust(widths[0]), *numbers, row[5]]))
    lines.append(f"Last index: {report.last_index}    Records in segments: {report.total_records:,}")
    return "\n".join(lines)


def _info(scan: SegmentScan, *, covered: bool, problem: str | None) -> SegmentInfo:
    return SegmentInfo(
        file=os.path.basename(scan.path),
        first_index=scan.first_index,
        last_index=scan.last_index,
        records=scan.records,
        bytes=scan.size,
        covered=covered,
        problem=problem,
    )


def _ignore(index: int, payload: bytes) -> None:
    """inspect_wal only counts records; it has nothing to apply them to."""
