"""The registry's records in etcd, behind the same :class:`~registry.store.Store` contract as the WAL.

Talks to etcd's own v3 JSON gateway (``/v3/kv/*``, ``/v3/watch``) over aiohttp: no new dependency,
one HTTP stack. Memory is built from a consistent range read at one revision, then kept current by a
watch from the next revision; every change, ours included, reaches memory through that watch, so
listeners see one order. A write is acknowledged only once etcd committed it and the watch applied it.
A failing or quorum-less cluster fails writes with :class:`WalUnavailable` (HTTP 503) within ``timeout``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import msgspec

from registry.etcd_http import EtcdHttp, Header, KeyValue, Range, Txn, Written, b64, decode, prefix_end, unb64
from registry.store import Change, Fence, Fenced, Records
from wal import WalHealth, WalUnavailable

log = logging.getLogger("agentreach.registry.etcd")


class _Event(msgspec.Struct):
    kv: KeyValue
    type: str = "PUT"


class _WatchResult(msgspec.Struct):
    header: Header = Header()
    events: list[_Event] = []
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""
    # Set on every part of a message etcd split (watch option "fragment") but the last.
    fragment: bool = False


class _WatchLine(msgspec.Struct):
    result: _WatchResult | None = None
    error: dict[str, Any] | None = None


# One watch line: a part of at most etcd's request size (1.5 MiB by default, configurable), base64
# (4/3) and wrapped in JSON. aiohttp's default line limit (128 KiB) stopped the watch on a large value.
_MAX_WATCH_LINE = 16 * 1024 * 1024


class Compacted(Exception):
    """The watch asked for a revision etcd no longer keeps: memory must be read afresh."""


class EtcdStore(Records):
    """Records in etcd under ``prefix``; memory from a range read plus a resumable watch."""

    def __init__(self, endpoints: list[str], prefix: str = "/agentreach/", *, timeout: float = 3.0,
                 retry_delay: float = 0.2):
        super().__init__()
        self.etcd = EtcdHttp(endpoints, timeout)
        self._prefix = prefix
        # Where put_if_unchanged's claim keys live: beside the records, outside the watched prefix.
        self._claims = prefix.rstrip("/") + ".claims/"
        self._timeout = timeout
        self._retry_delay = retry_delay
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._watching: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._opened = False
        # etcd's revision up to which every change under the prefix is in memory (the watch resumes after it).
        self._seen = 0
        # Seconds between etcd committing this node's last write and the watch delivering it.
        self.watch_lag: float | None = None

    @property
    def health(self) -> WalHealth:
        """While unwritable, each look starts one quorum read in the background: its success (quorum is
        back) makes the store writable again even when no write comes to prove it."""
        health = self.etcd.health
        if not health.writable and self._probing is None and self._opened:
            self._probing = asyncio.get_running_loop().create_task(self._probe())
        return health

    async def _probe(self) -> None:
        try:
            await self.etcd.request("/v3/kv/range", {"key": b64(self._prefix), "limit": 1})
        except WalUnavailable:
            pass
        finally:
            self._probing = None

    async def open(self) -> None:
        """Read every record at one revision, then follow changes from the next one."""
        self.etcd.open()
        try:
            await self._reset()
        except BaseException:
            await self.etcd.close()
            raise
        self._opened = True
        self._watching = asyncio.get_running_loop().create_task(self._watch_forever())

    async def _reset(self) -> None:
        """Read every record at one revision; listeners hear what differs from memory (none are missed)."""
        raw = await self.etcd.request("/v3/kv/range", {"key": b64(self._prefix), "range_end": prefix_end(self._prefix)})
        read = decode(raw, Range)
        items = {unb64(kv.key)[len(self._prefix):]: base64.b64decode(kv.value) for kv in read.kvs}
        gone = [Change(key, None, read.header.revision) for key in self._items if key not in items]
        changed = [Change(key, value, read.header.revision) for key, value in items.items()
                   if self._items.get(key) != value]
        self._items = items
        # Only the records' own revisions: the cluster's keys (registry/etcd_cluster.py) share etcd's revision
        # counter, and a follower resuming at another node must find the same number there.
        self.revision = max((kv.mod_revision for kv in read.kvs), default=0)
        self._seen = read.header.revision
        for change in gone + changed:
            self._tell(change)
        self._wake()

    async def _watch_forever(self) -> None:
        while True:
            try:
                await self._follow()
                log.warning("etcd watch ended; resuming", extra={"revision": self.revision})
            except Compacted:
                log.warning("etcd compacted past our revision; reading every record afresh",
                            extra={"revision": self.revision})
                await self._retrying(self._reset)
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("etcd watch lost; resuming", extra={"revision": self.revision, "error": str(exc)})
            self.etcd.next_endpoint()
            await asyncio.sleep(self._retry_delay)

    async def _retrying(self, step: Callable[[], Any]) -> None:
        while True:
            try:
                await step()
                return
            except WalUnavailable:
                await asyncio.sleep(self._retry_delay)

    async def _follow(self) -> None:
        """One watch stream from ``revision + 1``, applying events until it ends."""
        # "fragment": etcd splits a large batch of events into parts of at most its request size, so one
        # line stays bounded (_MAX_WATCH_LINE) however many changes land at once.
        body = {"create_request": {"key": b64(self._prefix), "range_end": prefix_end(self._prefix),
                                   "start_revision": self._seen + 1, "fragment": True}}
        endpoint = self.etcd.endpoint()
        # No total timeout: the stream is meant to stay open; only connecting is bounded.
        streaming = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout)
        async with self.etcd.session.post(endpoint + "/v3/watch", json=body, timeout=streaming) as response:
            while line := await response.content.readuntil(b"\n", max_size=_MAX_WATCH_LINE):
                if not line.strip():
                    continue
                message = decode(line, _WatchLine)
                if message.error is not None or message.result is None:
                    raise aiohttp.ClientPayloadError(f"etcd watch error: {message.error}")
                result = message.result
                if result.compact_revision:
                    raise Compacted(result.compact_revision)
                if result.canceled:
                    raise aiohttp.ClientPayloadError(f"etcd cancelled the watch: {result.cancel_reason}")
                for event in result.events:
                    self._apply_event(event)
                if not result.fragment:  # a transaction's events may span parts: wake writers after the last
                    self._wake()

    def _restart_watch(self) -> None:
        """Drop the watch stream and follow again from ``_seen`` at the endpoint requests reach now."""
        if self._watching is not None:
            self._watching.cancel()
        log.warning("etcd watch silent past a write's timeout; following again", extra={"revision": self.revision})
        self._watching = asyncio.get_running_loop().create_task(self._watch_forever())

    def _apply_event(self, event: _Event) -> None:
        key = unb64(event.kv.key)[len(self._prefix):]
        if event.type == "DELETE":
            self._items.pop(key, None)
            change = Change(key, None, event.kv.mod_revision)
        else:
            value = base64.b64decode(event.kv.value)
            self._items[key] = value
            change = Change(key, value, event.kv.mod_revision)
        self.revision = self._seen = event.kv.mod_revision
        self._tell(change)

    def _wake(self) -> None:
        waiting = []
        for revision, future in self._waiters:
            if revision <= self._seen:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((revision, future))
        self._waiters = waiting

    async def _applied(self, revision: int) -> int:
        """Wait until the watch has applied ``revision``: the caller then reads its own write."""
        waiting_since = time.monotonic()
        if revision > self._seen:
            future = asyncio.get_running_loop().create_future()
            self._waiters.append((revision, future))
            try:
                await asyncio.wait_for(future, self._timeout)
            except TimeoutError:
                # The watch's member may hang (frozen, cut off) while requests reach another: follow afresh.
                self._restart_watch()
                raise WalUnavailable(f"etcd committed revision {revision} but the watch has not delivered it") from None
        self.watch_lag = time.monotonic() - waiting_since
        return revision

    async def put(self, key: str, value: bytes, fence: Fence | None = None) -> int:
        request = {"key": b64(self._prefix + key), "value": base64.b64encode(value).decode()}
        if fence is None:
            return await self._applied(decode(await self.etcd.request("/v3/kv/put", request), Written).header.revision)
        body = {"compare": [{"key": b64(fence.key), "target": "CREATE", "result": "EQUAL",
                             "create_revision": fence.create_revision}],
                "success": [{"request_put": request}]}
        written = decode(await self.etcd.request("/v3/kv/txn", body), Txn)
        if not written.succeeded:
            raise Fenced(f"{fence.key} is no longer at create revision {fence.create_revision}")
        return await self._applied(written.header.revision)

    async def put_if_unchanged(self, key: str, value: bytes, since: int, prefixes: list[str],
                               claims: Sequence[str] = (), held: Sequence[str] = ()) -> int | None:
        """One etcd txn: put if every key under ``prefixes`` and every claim key (``claims`` and ``held``) has
        mod_revision <= ``since``, touching the ``claims`` in the same step; else read the newest such key's
        revision, so memory can be awaited up to it. Claim keys live beside the records (never watched): a
        touch marks "this name was taken at this revision", so writers racing to take one name collide on
        one key, and a writer adding to a name its service holds only needs to see nobody took it meanwhile
        (a whole-prefix compare costs etcd a scan of every key under it)."""
        ranges = [(b64(self._prefix + prefix), prefix_end(self._prefix + prefix)) for prefix in prefixes]
        touched = [b64(self._claims + claim) for claim in claims]
        compared = touched + [b64(self._claims + claim) for claim in held]
        body = {
            "compare": [{"key": start, "range_end": end, "target": "MOD", "result": "LESS",
                         "mod_revision": since + 1} for start, end in ranges]
            + [{"key": claim, "target": "MOD", "result": "LESS", "mod_revision": since + 1} for claim in compared],
            "success": [{"request_put": {"key": b64(self._prefix + key), "value": base64.b64encode(value).decode()}}]
            + [{"request_put": {"key": claim, "value": b64(key)}} for claim in touched],
            "failure": [{"request_range": {"key": start, "range_end": end, "keys_only": True, "limit": 1,
                                           "sort_target": "MOD", "sort_order": "DESCEND"}} for start, end in ranges]
            + [{"request_range": {"key": claim, "keys_only": True}} for claim in compared],
        }
        written = decode(await self.etcd.request("/v3/kv/txn", body), Txn)
        if written.succeeded:
            return await self._applied(written.header.revision)
        await self._applied(max(kv.mod_revision for response in written.responses
                                for kv in response.response_range.kvs))
        return None

    async def caught_up(self, key: str) -> None:
        """A quorum read of the key's revision, then waiting for the watch to apply it (a deletion made elsewhere
        leaves no revision to wait for: memory may hold the deleted value a moment longer)."""
        read = decode(await self.etcd.request("/v3/kv/range", {"key": b64(self._prefix + key), "keys_only": True}),
                      Range)
        await self._applied(max((kv.mod_revision for kv in read.kvs), default=0))

    async def delete(self, key: str) -> int:
        raw = await self.etcd.request("/v3/kv/deleterange", {"key": b64(self._prefix + key)})
        written = decode(raw, Written)
        # Deleting nothing makes no revision, so no event to wait for.
        return await self._applied(written.header.revision) if written.deleted else self.revision

    async def close(self) -> None:
        for task in (self._watching, self._probing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.etcd.close()
