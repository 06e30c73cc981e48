"""Fan-out of live events to the browsers' server-sent-event streams.

Each subscriber has a small queue; a slow browser loses its oldest events rather than holding
the collector back, which is right for state snapshots where only the newest one matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

QUEUE_SIZE = 4


class Event:
    __slots__ = ("data", "topic")

    def __init__(self, topic: str, data: bytes):
        self.topic = topic
        self.data = data

    def encode(self) -> bytes:
        return b"event: " + self.topic.encode() + b"\ndata: " + self.data + b"\n\n"


class Hub:
    def __init__(self) -> None:
        self._queues: dict[asyncio.Queue[Event | None], frozenset[str]] = {}
        self.latest: dict[str, Event] = {}

    @property
    def subscribers(self) -> int:
        return len(self._queues)

    def wanted(self, topic: str) -> bool:
        """Whether any browser follows ``topic`` (so the collector can skip building it)."""
        return any(topic in topics for topics in self._queues.values())

    def publish(self, topic: str, data: bytes) -> None:
        event = Event(topic, data)
        self.latest[topic] = event
        for queue, topics in self._queues.items():
            if topic not in topics:
                continue
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)

    async def subscribe(self, topics: frozenset[str], keepalive: float = 15.0) -> AsyncIterator[Event | None]:
        """The latest event of each topic at once, then every new one; None when idle for
        ``keepalive`` seconds (a cue to send a comment so proxies keep the stream open)."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_SIZE)
        self._queues[queue] = topics
        try:
            for topic in sorted(topics):
                if topic in self.latest:
                    yield self.latest[topic]
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), keepalive)
                except TimeoutError:
                    yield None
                    continue
                if event is None:
                    return
                yield event
        finally:
            self._queues.pop(queue, None)

    def close(self) -> None:
        """End every stream (the server is stopping)."""
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(None)
