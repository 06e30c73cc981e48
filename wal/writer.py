"""The disk side of appending: batches, rollover and compaction of segments.

A SegmentWriter is confined to the log's single writer thread, so segment
state needs no locks and every disk mutation happens in one serial order:
a compaction can never interleave with half of a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from .encoder import encode_batch
from .files import remove_files
from .segment import ActiveSegment, SegmentFile, covered_count, create_segment


class SegmentWriter:
    """Owns the segment chain after recovery; the last segment is the active one."""

    def __init__(self, directory: str, segments: list[SegmentFile], next_index: int, segment_bytes: int) -> None:
        self._directory = directory
        self._segments = list(segments)
        self._segment_bytes = segment_bytes
        self._active = ActiveSegment(self._segments[-1])
        self.next_index = next_index
        self.syncs = 0

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def write_batch(self, payloads: Sequence[bytes]) -> int:
        """Durably append `payloads` as consecutive records; return the first one's index."""
        if self._active.size >= self._segment_bytes:
            self._roll()
        first = self.next_index
        self._active.write_durably(encode_batch(first, payloads))
        self.syncs += 1
        self.next_index += len(payloads)
        return first

    def release_through(self, index: int) -> int:
        """Remove every segment whose records are all <= `index`; return how many.

        If the active segment holds only such records it is rolled first, so
        a snapshot of everything written so far frees every segment. Segments
        are forgotten before their files go, so a failed removal leaves files
        that the next open() lists as covered and the next snapshot removes.
        """
        if self._active.size > 0 and self.next_index - 1 <= index:
            self._roll()
        count = covered_count(self._segments, index)
        released = self._segments[:count]
        del self._segments[:count]
        remove_files(self._directory, [segment.path for segment in released])
        return count

    def close(self) -> None:
        self._active.close()

    def _roll(self) -> None:
        segment = create_segment(self._directory, self.next_index)
        self.syncs += 2  # create_segment fsyncs the new file and its directory
        self._active.close()
        self._active = ActiveSegment(segment)
        self._segments.append(segment)
