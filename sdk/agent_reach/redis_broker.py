"""Redis Streams as the mq broker (agent_reach.broker): XADD / XREAD for the router, a consumer group
(XREADGROUP, XCLAIM, XAUTOCLAIM, XACK) for agents, pub/sub and keys for cancels, SET NX for shared nonces.

Needs the ``redis`` package (``pip install 'agent-reach-sdk[mq]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from agent_reach.broker import BrokerDown, Entry
from agent_reach.mq_wire import FIELD, cancel_channel, cancelled_key, dead_letters

T = TypeVar("T")
# Pooled connections to the broker: each blocking read holds one for its wait.
MAX_CONNECTIONS = 256


# Read entries of a reply stream are dropped (XTRIM MINID keeps the id itself), and the stream outlives its
# router by a while at most.
_FORGET = """redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1]); redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])"""
_CANCEL = "redis.call('SET', KEYS[1], '1', 'PX', ARGV[2]); redis.call('PUBLISH', KEYS[2], ARGV[1])"
_DONE = "redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]); redis.call('XDEL', KEYS[1], ARGV[2])"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _guarded(command: Callable[[], Awaitable[T]]) -> T:
    """Run one command; a broker that is down or drops the connection is BrokerDown."""
    try:
        return await command()
    except (RedisConnectionError, RedisTimeout, OSError) as exc:
        raise BrokerDown(f"the broker is unreachable: {exc}") from exc


def _entries(found: Any, deliveries: int = 1) -> list[Entry]:
    """XREAD / XREADGROUP answers ([[stream, [(id, fields)]]]) or XCLAIM's ([(id, fields)]) as entries; an
    entry deleted while pending comes back without fields, and is left out."""
    return [Entry(_text(entry_id), fields.get(FIELD, b""), deliveries) for entry_id, fields in found if fields]


class RedisBroker:
    def __init__(self, url: str):
        self.url = url
        self._client = aioredis.Redis.from_url(url, decode_responses=False, max_connections=MAX_CONNECTIONS)
        self._scripts = {script: self._client.register_script(script) for script in (_FORGET, _CANCEL, _DONE)}

    async def close(self) -> None:
        await self._client.aclose()

    async def publish(self, stream: str, message: bytes) -> str:
        return _text(await _guarded(lambda: self._client.xadd(stream, {FIELD: message})))

    async def read(self, stream: str, after: str, block_s: float, count: int) -> list[Entry]:
        found: Any = await _guarded(lambda: self._client.xread({stream: after}, count=count, block=int(block_s * 1000)))
        return [entry for _, entries in found or [] for entry in _entries(entries)]

    async def forget(self, stream: str, up_to: str, keep_s: float) -> None:
        await self._script(_FORGET, [stream], [up_to, int(keep_s)])

    async def cancel(self, stream: str, request_id: str, ttl_s: float) -> None:
        await self._script(_CANCEL, [cancelled_key(stream, request_id), cancel_channel(stream)],
                           [request_id, max(int(ttl_s * 1000), 1)])

    async def _script(self, script: str, keys: list[str], args: list[str | int]) -> Any:
        """Several commands in one round trip, run together (EVALSHA, loaded on first use)."""
        return await _guarded(lambda: self._scripts[script](keys=keys, args=args))

    async def join(self, stream: str, group: str) -> None:
        try:
            await _guarded(lambda: self._client.xgroup_create(stream, group, id="0", mkstream=True))
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def take(self, stream: str, group: str, consumer: str, count: int, block_s: float) -> list[Entry]:
        found: Any = await _guarded(lambda: self._client.xreadgroup(group, consumer, {stream: ">"}, count=count,
                                                                block=int(block_s * 1000)))
        return [entry for _, entries in found or [] for entry in _entries(entries)]

    async def hold(self, stream: str, group: str, consumer: str, ids: list[str]) -> None:
        if ids:
            held: list[str | bytes | int | memoryview[int]] = list(ids)
            await _guarded(lambda: self._client.xclaim(stream, group, consumer, 0, held, justid=True))

    async def claim(self, stream: str, group: str, consumer: str, idle_s: float, count: int) -> list[Entry]:
        idle_ms = int(idle_s * 1000)
        answer: Any = await _guarded(lambda: self._client.xautoclaim(stream, group, consumer, idle_ms, count=count))
        claimed = answer[1]
        if not claimed:
            return []
        entries = _entries(claimed)
        # XAUTOCLAIM counted this delivery; each entry's count is read from the pending list, entry by entry (a
        # range would also hold the older entries this consumer runs, and could end before the claimed ones).
        rows: Any = await _guarded(lambda: asyncio.gather(*(
            self._client.xpending_range(stream, group, entry.id, entry.id, 1) for entry in entries)))
        delivered = {_text(row["message_id"]): int(row["times_delivered"]) for found in rows for row in found}
        return [Entry(entry.id, entry.message, delivered.get(entry.id, 2)) for entry in entries]

    async def done(self, stream: str, group: str, entry_id: str) -> None:
        await self._script(_DONE, [stream], [group, entry_id])

    async def dead_letter(self, stream: str, group: str, entry: Entry, reason: str) -> None:
        await _guarded(lambda: self._client.xadd(dead_letters(stream), {
            FIELD: entry.message, b"from": entry.id, b"deliveries": entry.deliveries, b"reason": reason}))
        await self.done(stream, group, entry.id)

    async def cancelled(self, stream: str, request_id: str) -> bool:
        return bool(await _guarded(lambda: self._client.exists(cancelled_key(stream, request_id))))

    async def first_use(self, key: str, entry_id: str, ttl_s: float) -> bool:
        if await _guarded(lambda: self._client.set(key, entry_id, nx=True, px=max(int(ttl_s * 1000), 1))):
            return True
        holder: Any = await _guarded(lambda: self._client.get(key))
        return holder is not None and _text(holder) == entry_id  # the same entry, delivered again

    async def cancels(self, streams: list[str]) -> AsyncIterator[str]:
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await _guarded(lambda: pubsub.subscribe(*(cancel_channel(stream) for stream in streams)))
            while True:
                message = await _guarded(lambda: pubsub.get_message(timeout=None))
                if message is not None and message.get("type") == "message":
                    yield _text(message["data"])
        finally:
            # Typed here: redis-py annotates aclose from 8.2 only, and the SDK takes 5.0 and later.
            close: Callable[[], Awaitable[None]] = pubsub.aclose
            with contextlib.suppress(Exception):
                await close()
