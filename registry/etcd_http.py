"""Speaking etcd's v3 JSON gateway over aiohttp: one client for the records store and the cluster's leases.

No new dependency and one HTTP stack. A request goes to the current endpoint and moves to the next on a
connection failure; none answering within ``timeout`` (down, or no quorum so nothing commits) raises
:class:`WalUnavailable`, the same outage a full disk raises, and marks the client unhealthy until a
request succeeds again.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, TypeVar

import aiohttp
import msgspec
from agent_reach import peer_json

from wal import WalHealth, WalUnavailable

T = TypeVar("T")


class KeyValue(msgspec.Struct):
    key: str
    value: str = ""
    mod_revision: int = 0
    create_revision: int = 0


class Header(msgspec.Struct, frozen=True):
    revision: int = 0


class Range(msgspec.Struct):
    header: Header
    kvs: list[KeyValue] = []


class Written(msgspec.Struct):
    header: Header
    deleted: int = 0


class Ranged(msgspec.Struct):
    kvs: list[KeyValue] = []


class TxnResponse(msgspec.Struct):
    response_range: Ranged = msgspec.field(default_factory=Ranged)


class Txn(msgspec.Struct):
    header: Header
    succeeded: bool = False
    responses: list[TxnResponse] = []


def decode(data: bytes, kind: type[T]) -> T:
    """The gateway writes int64 fields as JSON strings; strict=False reads them as ints."""
    return peer_json.decode(data, type=kind, strict=False)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """etcd's range_end for "every key starting with prefix": the prefix with its last byte plus one."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


class EtcdHttp:
    """The endpoints, the one that answered last, and whether any answers now."""

    def __init__(self, endpoints: list[str], timeout: float):
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self.current = 0
        self.timeout = timeout
        self.health = WalHealth(writable=True)
        # Seconds the last answered request took: etcd's round trip as this node sees it.
        self.last_rtt: float | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "open() first"
        return self._session

    def open(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def endpoint(self) -> str:
        return self.endpoints[self.current]

    def next_endpoint(self) -> None:
        self.current = (self.current + 1) % len(self.endpoints)

    async def request(self, path: str, body: dict[str, Any]) -> bytes:
        """POST to the current endpoint, moving to the next on a connection failure or a silent member, until
        ``timeout``. Each try gets a quarter of it: a member that lost its leader drops proposals and answers
        only at its own request timeout, while the next member (or the same one, once a new leader is elected
        half a second later) commits at once. Sending again is safe for every request the stores make: the
        same put, a delete, a txn whose compare fails if the first try did commit."""
        if self._session is None or self._session.closed:
            # The registry is stopping: a request still in a handler gets the store's outage (503), not a 500.
            raise WalUnavailable("etcd: this registry node is stopping")
        deadline = time.monotonic() + self.timeout
        per_try = self.timeout / 4
        problem = "no endpoint answered"
        tries = 0
        while (left := deadline - time.monotonic()) > 0:
            endpoint = self.endpoint()
            started = time.monotonic()
            try:
                async with self.session.post(endpoint + path, json=body,
                                             timeout=aiohttp.ClientTimeout(total=min(left, per_try))) as response:
                    data = await response.read()
                    if response.status != 200:
                        problem = f"{endpoint} answered {response.status}: {data[:200]!r}"
                    else:
                        self.last_rtt = time.monotonic() - started
                        self._set_health(None)
                        return data
            except aiohttp.ClientConnectionError as exc:
                problem = f"{endpoint}: {exc}"
            except TimeoutError:
                problem = f"{endpoint}: no answer within {per_try:.2f}s (no quorum?)"
            self.next_endpoint()
            tries += 1
            if tries % len(self.endpoints) == 0:  # every member tried: do not spin on refused connections
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        self._set_health(problem)
        raise WalUnavailable(f"etcd: {problem}")

    def _set_health(self, problem: str | None) -> None:
        if problem is None and not self.health.writable:
            self.health = WalHealth(writable=True)
        elif problem is not None and self.health.writable:
            self.health = WalHealth(writable=False, problem=problem, since=time.time())
