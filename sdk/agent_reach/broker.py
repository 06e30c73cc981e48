"""What Agent Reach needs of a message broker for ``protocol: "mq"`` (agent_reach.mq_wire), whichever broker it
is: Redis Streams today (agent_reach.redis_broker); a second broker implements this and nothing else changes.

The router publishes calls and reads its reply stream; an agent reads a request stream in a consumer group,
holds what it runs, claims what a dead sibling held, and acks, dead-letters or drops each entry. Messages are
bytes (an envelope and a body); entry ids are the broker's, opaque strings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple, Protocol


class Entry(NamedTuple):
    id: str
    message: bytes
    # How many times the group has handed this entry out (1: first delivery).
    deliveries: int


class BrokerDown(ConnectionError):
    """The broker could not be reached or dropped the connection: nothing is known to have been done."""


class Broker(Protocol):
    # The router's side.

    async def publish(self, stream: str, message: bytes) -> str:
        """Append ``message`` to ``stream``; its entry id."""
        ...

    async def read(self, stream: str, after: str, block_s: float, count: int) -> list[Entry]:
        """Entries of ``stream`` after the id ``after`` (no group), waiting up to ``block_s`` for one."""
        ...

    async def forget(self, stream: str, up_to: str, keep_s: float) -> None:
        """Drop the entries of ``stream`` up to ``up_to`` (read already); the stream expires ``keep_s`` after."""
        ...

    async def cancel(self, stream: str, request_id: str, ttl_s: float) -> None:
        """Tell the instances of ``stream`` the call is given up: the one running it, and any yet to take it."""
        ...

    # An agent's side.

    async def join(self, stream: str, group: str) -> None:
        """Create ``group`` on ``stream`` (and the stream) unless it exists."""
        ...

    async def take(self, stream: str, group: str, consumer: str, count: int, block_s: float) -> list[Entry]:
        """New entries for ``consumer``, at most ``count``, waiting up to ``block_s`` for one."""
        ...

    async def hold(self, stream: str, group: str, consumer: str, ids: list[str]) -> None:
        """Reset the idle time of entries ``consumer`` still works on, so no sibling claims them."""
        ...

    async def claim(self, stream: str, group: str, consumer: str, idle_s: float, count: int) -> list[Entry]:
        """Entries some consumer took and left idle ``idle_s`` (it died holding them), now ``consumer``'s."""
        ...

    async def done(self, stream: str, group: str, entry_id: str) -> None:
        """The entry is finished with (answered, dropped or dead-lettered): acknowledged and deleted."""
        ...

    async def dead_letter(self, stream: str, group: str, entry: Entry, reason: str) -> None:
        """Move the entry to the stream's dead-letter stream, with why, and finish with it."""
        ...

    async def cancelled(self, stream: str, request_id: str) -> bool:
        """Whether the router gave the call up before it was taken."""
        ...

    async def first_use(self, key: str, entry_id: str, ttl_s: float) -> bool:
        """Claim ``key`` for the entry ``entry_id`` for ``ttl_s``: False when another entry holds it (a replay)."""
        ...

    def cancels(self, streams: list[str]) -> AsyncIterator[str]:
        """The request ids cancelled on the cancel channels of ``streams``, as they come."""
        ...

    async def close(self) -> None: ...
