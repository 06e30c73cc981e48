"""WriteAheadLog: durable appends with group commit, snapshots and start-up replay.

Appends queue on the event loop; one flusher task hands everything queued to
the writer thread as a single write + fdatasync, so while one sync is in
flight the next batch accumulates. The event loop never touches the disk
except in open(), which runs before serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec

from .decoder import Apply
from .encoder import MAX_PAYLOAD
from .errors import WalError
from .files import ensure_directory, lock_directory
from .replay import ReplayReport, recover
from .snapshot import remove_snapshots_before, write_snapshot
from .writer import SegmentWriter

log = logging.getLogger("agentreach.wal")

DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024


class WalStats(msgspec.Struct, frozen=True):
    """Counters since open(), for metrics and the benchmark.

    `syncs` counts every fsync/fdatasync on the append path: one per batch
    plus two per segment rollover (the new file and its directory).
    """

    records: int
    batches: int
    syncs: int
    segments: int
    snapshot_index: int


class WriteAheadLog:
    """An append-only, crash-safe record log with group commit.

    Call open() once, then append() and snapshot() from one event loop, then
    close(). A failed write stops the log for good (fail-stop): a half-written
    batch must never be followed by more records.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        group_commit: bool = True,
        on_commit: Callable[[int, bytes], None] | None = None,
    ) -> None:
        if segment_bytes <= 0:
            raise ValueError("segment_bytes must be positive")
        self._directory = os.path.abspath(directory)
        self._segment_bytes = segment_bytes
        self._group_commit = group_commit
        self._on_commit = on_commit
        self._writer: SegmentWriter | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock_fd: int | None = None
        self._pending: deque[tuple[bytes, asyncio.Future[int]]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._snapshot_lock = asyncio.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self._last_index = 0
        self._snapshot_index = 0
        self._records = 0
        self._batches = 0

    @property
    def last_index(self) -> int:
        """Index of the last durable record (0 when the log is empty)."""
        return self._last_index

    @property
    def stats(self) -> WalStats:
        writer = self._writer
        return WalStats(
            records=self._records,
            batches=self._batches,
            syncs=writer.syncs if writer else 0,
            segments=writer.segment_count if writer else 0,
            snapshot_index=self._snapshot_index,
        )

    def open(self, apply_snapshot: Apply, apply_record: Apply) -> ReplayReport:
        """Replay the snapshot and the records after it, repairing a torn tail; blocks."""
        if self._writer is not None or self._closed:
            raise WalError("open() may be called only once")
        ensure_directory(self._directory)
        lock_fd = lock_directory(self._directory)
        try:
            recovery = recover(self._directory, apply_snapshot, apply_record)
            report = recovery.report
            self._writer = SegmentWriter(self._directory, recovery.segments, report.last_index + 1, self._segment_bytes)
        except BaseException:
            os.close(lock_fd)
            raise
        self._lock_fd = lock_fd
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentreach-wal")
        self._last_index = report.last_index
        self._snapshot_index = report.snapshot_index
        return report

    async def append(self, payload: bytes) -> int:
        """Append one record; return its index once it is durable and on_commit has seen it."""
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the {MAX_PAYLOAD}-byte record limit")
        self._check_usable()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((payload, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return await future

    async def snapshot(self, index: int, data: bytes) -> None:
        """Store `data` as the state through `index`, then drop segments and snapshots it makes redundant."""
        self._check_usable()
        if not 0 <= index <= self._last_index:
            raise ValueError(f"snapshot index {index} is outside 0..{self._last_index} (the last durable index)")
        async with self._snapshot_lock:
            if index < self._snapshot_index:
                raise ValueError(f"snapshot index {index} is older than the current snapshot {self._snapshot_index}")
            loop = asyncio.get_running_loop()
            written = await loop.run_in_executor(None, write_snapshot, self._directory, index, data)
            released = await loop.run_in_executor(self._executor, self._compact, index)
            self._snapshot_index = index
        log.info(
            "wrote snapshot %s, released %d segments",
            written.path,
            released,
            extra={"wal_path": written.path, "index": index, "bytes": len(data), "segments_released": released},
        )

    async def close(self) -> None:
        """Finish queued appends and any snapshot in progress, then release the files."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        async with self._snapshot_lock:
            if self._writer is None:
                return
            await asyncio.get_running_loop().run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown()
        os.close(self._lock_fd)

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise WalError("the log stopped after a failed write; restart to recover") from self._failure
        if self._closed:
            raise WalError("the log is closed")
        if self._writer is None:
            raise WalError("open() has not been called")

    def _compact(self, index: int) -> int:
        """Runs on the writer thread, serialised with batches, so no append can be lost."""
        released = self._writer.release_through(index)
        remove_snapshots_before(self._directory, index)
        return released

    async def _flush(self) -> None:
        """Drain the queue one batch at a time until it is empty or the log has failed."""
        loop = asyncio.get_running_loop()
        try:
            while self._pending and self._failure is None:
                if self._group_commit:
                    batch = list(self._pending)
                    self._pending.clear()
                else:
                    batch = [self._pending.popleft()]
                payloads = [payload for payload, _ in batch]
                try:
                    first = await loop.run_in_executor(self._executor, self._writer.write_batch, payloads)
                except BaseException as exc:
                    self._fail(exc, batch, f"writing a batch of {len(batch)} records failed")
                    if not isinstance(exc, Exception):
                        raise
                    return
                self._commit(first, batch)
        finally:
            self._flusher = None

    def _commit(self, first: int, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        """Publish a durable batch: on_commit in index order, then wake its appenders."""
        self._last_index = first + len(batch) - 1
        self._records += len(batch)
        self._batches += 1
        if self._on_commit is not None:
            try:
                for index, (payload, _) in enumerate(batch, first):
                    self._on_commit(index, payload)
            except Exception as exc:
                self._fail(exc, batch, f"on_commit raised for a record of batch {first}..{self._last_index}")
                return
        for index, (_, future) in enumerate(batch, first):
            if not future.done():
                future.set_result(index)

    def _fail(self, exc: BaseException, batch: list[tuple[bytes, asyncio.Future[int]]], what: str) -> None:
        """Stop the log: fail this batch and everything queued behind it."""
        self._failure = exc
        log.error(
            "write-ahead log stopped: %s",
            what,
            exc_info=exc,
            extra={"wal_dir": self._directory, "last_index": self._last_index, "records": len(batch)},
        )
        doomed = batch + list(self._pending)
        self._pending.clear()
        for _, future in doomed:
            if not future.done():
                error = WalError(f"{what}; the log refuses further appends")
                error.__cause__ = exc
                future.set_exception(error)
