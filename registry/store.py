"""The registry's durable state behind one small interface: put / put_if_unchanged / delete / snapshot / watch.

The lifecycle logic and the HTTP layer only see :class:`Store`. :class:`WalStore` keeps the
records in memory and makes every change durable in the local write-ahead log before it is
visible; :class:`~registry.etcd_store.EtcdStore` implements the same operations over etcd.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import msgspec

from wal import ReplayReport, WalHealth, WriteAheadLog

log = logging.getLogger("agentreach.registry.store")


class Change(msgspec.Struct, array_like=True, frozen=True):
    """One committed change: ``value`` None means the key was deleted."""

    key: str
    value: bytes | None
    revision: int = 0


Listener = Callable[[Change], None]


class Fence(msgspec.Struct, frozen=True):
    """Write only while etcd key ``key`` (a full key, outside the records' prefix) still has
    ``create_revision``: the leader's election key, so a node that lost the lead cannot evict."""

    key: str
    create_revision: int


class Fenced(Exception):
    """The write was refused: its fence no longer holds (another node leads now)."""


class Store(Protocol):
    revision: int

    @property
    def health(self) -> WalHealth:
        """Whether changes can be made durable now, and if not why (a full or read-only disk)."""
        ...

    async def put(self, key: str, value: bytes, fence: Fence | None = None) -> int:
        """Raises :class:`Fenced`, writing nothing, when ``fence`` no longer holds."""
        ...

    async def put_if_unchanged(self, key: str, value: bytes, since: int, prefixes: list[str],
                               claims: Sequence[str] = (), held: Sequence[str] = ()) -> int | None:
        """Put unless a key under one of ``prefixes``, or a claim (``claims``: names this write takes, e.g. a
        capability name; ``held``: names its writer holds already), changed after revision ``since`` (what
        memory was checked at); the write touches ``claims``. The check and the write are one step, so
        registries sharing a store cannot both take one name. None, once memory holds what changed, when
        one did: check again and retry."""
        ...

    async def delete(self, key: str) -> int: ...

    async def caught_up(self, key: str) -> None:
        """Return once memory holds the newest committed value of ``key``: another node may have written it
        a moment ago, and a writer may have seen that write already."""
        ...

    def snapshot(self) -> dict[str, bytes]:
        """Every record as of ``revision``."""
        ...

    def watch(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with each committed change, in revision order; returns an unsubscribe."""
        ...

    async def close(self) -> None: ...


_encoder = msgspec.msgpack.Encoder()
_change_decoder = msgspec.msgpack.Decoder(Change)
_items_decoder = msgspec.msgpack.Decoder(dict[str, bytes])


def encode_change(change: Change) -> bytes:
    """A change as the WAL stores it."""
    return _encoder.encode(change)


class Records:
    """The records in memory and who hears of each change: kept the same way by every store."""

    def __init__(self) -> None:
        self._items: dict[str, bytes] = {}
        self._listeners: list[Listener] = []
        self.revision = 0

    def _tell(self, change: Change) -> None:
        for listener in self._listeners:
            listener(change)

    def snapshot(self) -> dict[str, bytes]:
        return dict(self._items)

    def watch(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)


class WalStore(Records):
    """Records in a dict, every change in the WAL first; snapshots bound the replay."""

    def __init__(self, data_dir: Path, *, snapshot_every: int = 50_000, segment_bytes: int = 16 << 20,
                 group_commit: bool = True):
        super().__init__()
        self._snapshot_every = snapshot_every
        self._since_snapshot = 0
        self._snapshotting: asyncio.Task[None] | None = None
        self._wal = WriteAheadLog(Path(data_dir) / "wal", segment_bytes=segment_bytes,
                                  group_commit=group_commit, on_commit=self._commit)

    def open(self) -> ReplayReport:
        """Replay the snapshot and the log; blocking, for start-up only."""
        report = self._wal.open(self._load_snapshot, self._replay)
        log.info("wal replayed", extra={"snapshot_index": report.snapshot_index,
                                        "records": report.records_replayed,
                                        "last_index": report.last_index,
                                        "seconds": round(report.seconds, 3)})
        return report

    @property
    def wal(self) -> WriteAheadLog:
        return self._wal

    @property
    def health(self) -> WalHealth:
        return self._wal.health

    def _load_snapshot(self, index: int, data: bytes) -> None:
        self._items = _items_decoder.decode(data)
        self.revision = index

    def _apply(self, index: int, change: Change) -> None:
        if change.value is None:
            self._items.pop(change.key, None)
        else:
            self._items[change.key] = change.value
        self.revision = index

    def _replay(self, index: int, payload: bytes) -> None:
        self._apply(index, _change_decoder.decode(payload))

    def _commit(self, index: int, payload: bytes) -> None:
        change = msgspec.structs.replace(_change_decoder.decode(payload), revision=index)
        self._apply(index, change)
        self._tell(change)
        self._since_snapshot += 1
        if self._since_snapshot >= self._snapshot_every and self._snapshotting is None:
            self._snapshotting = asyncio.get_running_loop().create_task(self._take_snapshot())

    async def _take_snapshot(self) -> None:
        try:
            index, items = self.revision, dict(self._items)
            self._since_snapshot = 0
            # Encoding tens of megabytes off the loop keeps requests flowing meanwhile.
            data = await asyncio.get_running_loop().run_in_executor(None, msgspec.msgpack.encode, items)
            await self._wal.snapshot(index, data)
            log.info("snapshot written", extra={"index": index, "bytes": len(data)})
        except Exception:
            log.exception("snapshot failed; the log keeps every record, replay just takes longer")
        finally:
            self._snapshotting = None

    async def put(self, key: str, value: bytes, fence: Fence | None = None) -> int:
        """One process writes this log: it is the only node, so every fence holds."""
        return await self._wal.append(encode_change(Change(key, value)))

    async def put_if_unchanged(self, key: str, value: bytes, since: int, prefixes: list[str],
                               claims: Sequence[str] = (), held: Sequence[str] = ()) -> int | None:
        """One process writes this log: the registry's claims already keep its racing writes apart."""
        return await self.put(key, value)

    async def delete(self, key: str) -> int:
        return await self._wal.append(encode_change(Change(key, None)))

    async def caught_up(self, key: str) -> None:
        """Memory is this log's whole truth: only this process writes it."""

    async def close(self) -> None:
        if self._snapshotting is not None:
            await self._snapshotting
        await self._wal.close()
