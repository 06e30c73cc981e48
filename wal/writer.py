"""The disk side of appending: batches, rollover, compaction, and recovery after a failed write.

A SegmentWriter is confined to the log's single writer thread, so segment
state needs no locks and every disk mutation happens in one serial order:
a compaction can never interleave with half of a batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from .encoder import encode_batch
from .errors import WalUnavailable
from .files import remove_files, truncate_durably, write_all
from .private import open_private
from .segment import ActiveSegment, SegmentFile, covered_count, create_segment, replace_segment

PROBE_NAME = "PROBE"
# Room for real work, not one page, so a nearly full disk does not flap between available and full.
MIN_PROBE_BYTES = 1 << 20


class SegmentWriter:
    """Owns the segment chain after recovery; the last segment is the active one."""

    def __init__(self, directory: str, segments: list[SegmentFile], next_index: int, segment_bytes: int) -> None:
        self._directory = directory
        self._segments = list(segments)
        self._segment_bytes = segment_bytes
        self._active: ActiveSegment | None = ActiveSegment(self._segments[-1])
        # After a failed write: the synced length to cut the active segment back to, and the bytes it failed on.
        self._synced = 0
        self._needed = 0
        self.next_index = next_index
        self.syncs = 0

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def write_batch(self, payloads: Sequence[bytes]) -> int:
        """Durably append `payloads` as consecutive records; return the first one's index.

        On any OSError the active segment is abandoned (its descriptor closed,
        never synced again) and the writer refuses batches until recover().
        """
        active = self._active
        if active is None:
            raise WalUnavailable("the last write failed and the log is not repaired yet")
        data = encode_batch(self.next_index, payloads)
        try:
            if active.size >= self._segment_bytes:
                active = self._roll(active)
            active.write_durably(data)
        except OSError:
            self._abandon(active, len(data))
            raise
        self.syncs += 1
        first = self.next_index
        self.next_index += len(payloads)
        return first

    def recover(self) -> None:
        """Make the log appendable again after a failed write, or raise OSError to be retried.

        After a failed write or fsync the page cache's view of the segment is
        unknown (fsyncgate), so nothing more is written to it: it is cut back to
        the length last synced (no half batch left for replay to misread), the
        disk must take as many bytes as the failed batch, and appends continue in
        a new segment file.
        """
        assert self._active is None, "recover() is only for a writer whose write failed"
        truncate_durably(self._segments[-1].path, self._synced)
        probe_space(self._directory, max(self._needed, MIN_PROBE_BYTES))
        segment = replace_segment(self._directory, self.next_index)
        active = ActiveSegment(segment)
        self.syncs += 2
        if self._segments[-1].first_index == segment.first_index:
            self._segments[-1] = segment
        else:
            self._segments.append(segment)
        self._active = active

    def release_through(self, index: int) -> int:
        """Remove every segment whose records are all <= `index`; return how many.

        If the active segment holds only such records it is rolled first, so
        a snapshot of everything written so far frees every segment. Segments
        are forgotten before their files go, so a failed removal leaves files
        that the next open() lists as covered and the next snapshot removes.
        """
        if self._active is not None and self._active.size > 0 and self.next_index - 1 <= index:
            self._roll(self._active)
        count = covered_count(self._segments, index)
        released = self._segments[:count]
        del self._segments[:count]
        remove_files(self._directory, [segment.path for segment in released])
        return count

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def _roll(self, current: ActiveSegment) -> ActiveSegment:
        segment = create_segment(self._directory, self.next_index)
        self.syncs += 2  # create_segment fsyncs the new file and its directory
        active = ActiveSegment(segment)
        current.close()
        self._active = active
        self._segments.append(segment)
        return active

    def _abandon(self, active: ActiveSegment, needed: int) -> None:
        """Stop using the active segment and, if the disk allows, cut the failed bytes off before
        anyone hears of the failure: a crash now must not replay records their writers saw refused."""
        self._synced = active.size
        self._needed = needed
        self._active = None
        with contextlib.suppress(OSError):
            active.close()
        with contextlib.suppress(OSError):
            truncate_durably(self._segments[-1].path, self._synced)


def probe_space(directory: str, size: int) -> None:
    """Write and sync `size` bytes aside, then delete them: raises OSError while the disk cannot take them."""
    path = os.path.join(directory, PROBE_NAME)
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, bytes(size))
        os.fsync(fd)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
