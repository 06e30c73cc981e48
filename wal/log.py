"""WriteAheadLog: durable appends with group commit, snapshots and start-up replay.

Appends queue on the event loop; one flusher task hands everything queued to
the writer thread as a single write + fdatasync, so while one sync is in
flight the next batch accumulates. The event loop never touches the disk
except in open(), which runs before serving.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec

from .decoder import Apply
from .encoder import MAX_PAYLOAD
from .errors import WalError, WalUnavailable
from .private import open_private, private_dirs
from .replay import ReplayReport, recover
from .snapshot import remove_snapshots_before, write_snapshot
from .writer import SegmentWriter

log = logging.getLogger("agentreach.wal")

DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
LOCK_NAME = "LOCK"
# Repair attempts after a failed write back off from the first to the last delay, doubling.
REPAIR_BACKOFF = (0.05, 5.0)


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
    outages: int


class WalHealth(msgspec.Struct, frozen=True):
    """Whether the log takes appends; when not, why and since when (wall clock)."""

    writable: bool
    problem: str | None = None
    since: float | None = None


class WriteAheadLog:
    """An append-only, crash-safe record log with group commit.

    Call open() once, then append() and snapshot() from one event loop, then
    close(). A failed write fails its batch and everything queued (never
    acknowledged), refuses appends with WalUnavailable, and repairs the log in
    the background with backoff until the disk takes writes again. A failed
    on_commit stops the log for good: memory no longer matches the log.
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
        self._outage: WalHealth | None = None
        self._repair: asyncio.Task[None] | None = None
        self._outages = 0
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
            outages=self._outages,
        )

    @property
    def health(self) -> WalHealth:
        if self._failure is not None:
            return WalHealth(writable=False, problem=f"the log stopped: {self._failure}; restart to recover")
        return self._outage or WalHealth(writable=True)

    def open(self, apply_snapshot: Apply, apply_record: Apply) -> ReplayReport:
        """Replay the snapshot and the records after it, repairing a torn tail; blocks.

        A directory the process cannot write raises WalUnavailable, one line naming path and cause.
        """
        if self._writer is not None or self._closed:
            raise WalError("open() may be called only once")
        try:
            private_dirs(self._directory)
            lock_fd = lock_directory(self._directory)
        except OSError as exc:
            raise unusable(self._directory, exc) from exc
        try:
            recovery = recover(self._directory, apply_snapshot, apply_record)
            report = recovery.report
            self._writer = SegmentWriter(self._directory, recovery.segments, report.last_index + 1, self._segment_bytes)
        except OSError as exc:
            os.close(lock_fd)
            raise unusable(self._directory, exc) from exc
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
        if self._repair is not None:
            self._repair.cancel()
            await asyncio.gather(self._repair, return_exceptions=True)
        async with self._snapshot_lock:
            writer, executor, lock_fd = self._writer, self._executor, self._lock_fd
            if writer is None or executor is None or lock_fd is None:  # never opened: open() sets all three
                return
            await asyncio.get_running_loop().run_in_executor(executor, writer.close)
        executor.shutdown()
        os.close(lock_fd)

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise WalError("the log stopped after on_commit failed; restart to recover") from self._failure
        if self._outage is not None:
            raise WalUnavailable(f"storage is refusing writes: {self._outage.problem}")
        if self._closed:
            raise WalError("the log is closed")
        if self._writer is None:
            raise WalError("open() has not been called")

    def _compact(self, index: int) -> int:
        """Runs on the writer thread, serialised with batches, so no append can be lost."""
        assert self._writer is not None, "snapshot() checked the log is open"
        released = self._writer.release_through(index)
        remove_snapshots_before(self._directory, index)
        return released

    async def _flush(self) -> None:
        """Drain the queue one batch at a time until it is empty or the log has failed."""
        writer = self._writer
        assert writer is not None, "append() checked the log is open"
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
                    first = await loop.run_in_executor(self._executor, writer.write_batch, payloads)
                except OSError as exc:
                    self._begin_outage(exc, batch)
                    return
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
        self._refuse(batch, exc, WalError(f"{what}; the log refuses further appends"))

    def _refuse(self, batch: list[tuple[bytes, asyncio.Future[int]]], cause: BaseException, error: WalError) -> None:
        """Fail `batch` and everything queued behind it with `error` (caused by `cause`)."""
        error.__cause__ = cause
        doomed = batch + list(self._pending)
        self._pending.clear()
        for _, future in doomed:
            if not future.done():
                future.set_exception(error)

    def _begin_outage(self, exc: OSError, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        """Fail this batch and the queue (none of it was acknowledged) and start repairing."""
        problem, since = describe_os_error(exc), time.time()
        self._outage = WalHealth(writable=False, problem=problem, since=since)
        self._outages += 1
        log.error(
            "write-ahead log cannot write (%s); refusing changes until the disk takes writes again",
            problem,
            extra={"wal_dir": self._directory, "last_index": self._last_index, "records": len(batch)},
        )
        self._refuse(batch, exc, WalUnavailable(f"storage is refusing writes: {problem}"))
        self._repair = asyncio.get_running_loop().create_task(self._repair_until_writable(since))

    async def _repair_until_writable(self, since: float) -> None:
        """Retry the writer's recover() with doubling delays; the log takes appends once it succeeds."""
        writer = self._writer
        assert writer is not None, "an outage begins with a failed write"
        loop = asyncio.get_running_loop()
        delay, longest = REPAIR_BACKOFF
        while True:
            try:
                await loop.run_in_executor(self._executor, writer.recover)
                break
            except OSError as exc:
                self._outage = WalHealth(writable=False, problem=describe_os_error(exc), since=since)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)
        log.warning(
            "write-ahead log writable again after %.1f s; appends continue in a new segment",
            time.time() - since,
            extra={"wal_dir": self._directory, "last_index": self._last_index},
        )
        self._outage = None
        self._repair = None


def describe_os_error(exc: OSError) -> str:
    """`path: No space left on device`, the way an operator reads it."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def unusable(directory: str, exc: OSError) -> WalUnavailable:
    return WalUnavailable(f"cannot use the write-ahead log directory {directory}: {describe_os_error(exc)}")


def lock_directory(directory: str) -> int:
    """Take an exclusive lock so two processes never append to the same log."""
    fd = open_private(os.path.join(directory, LOCK_NAME), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalError(f"{directory} is already open (another WriteAheadLog holds its LOCK)") from None
    return fd
