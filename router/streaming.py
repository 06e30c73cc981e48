"""A streamed call's chunks on their way from the agent to the caller, and what is known of them.

The forwarder reads an agent's events; every chunk goes through the call's ``Relay``, which counts it
(the trace and the audit row say how many and how large) and passes it on at once to the caller's
stream when the caller asked for one. Nothing is held back: the chunks read together are written
together, before anything more is read.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import msgspec
from agent_reach.sse import EventWriter, chunk_event, encode_event


class ChunkSink(Protocol):
    async def chunks(self, batch: list[msgspec.Raw]) -> None: ...


class Relay:
    """One call's chunks, across its attempts: a failover happens only while ``chunks`` is 0."""

    def __init__(self, sink: ChunkSink | None = None):
        self.sink = sink
        self.chunks = 0
        self.bytes = 0

    @property
    def streaming(self) -> bool:
        """Whether the caller reads the chunks (else only the final answer reaches it)."""
        return self.sink is not None

    @property
    def delivered(self) -> bool:
        """Whether the caller has chunks already: then the call is neither failed over nor fallen back."""
        return self.sink is not None and self.chunks > 0

    async def pass_on(self, batch: list[msgspec.Raw]) -> None:
        """Chunks that arrived together: counted, and written to the caller at once, together."""
        self.chunks += len(batch)
        self.bytes += sum(len(data) for data in batch)
        if self.sink is not None:
            await self.sink.chunks(batch)


class CallerStream:
    """The caller's end of a streamed call: chunk events numbered from 0, then the final frame's event.
    A caller gone while a chunk is written cancels the call, as its disconnect does (api.py)."""

    def __init__(self, writer: EventWriter, request_id: str):
        self.writer = writer
        self.request_id = request_id
        self.seq = 0

    async def chunks(self, batch: list[msgspec.Raw]) -> None:
        events = b"".join(chunk_event(self.request_id, self.seq + n, data) for n, data in enumerate(batch))
        try:
            await self.writer.send(events)
        except ConnectionError:
            raise asyncio.CancelledError("the caller left while the answer streamed") from None
        self.seq += len(batch)

    async def end(self, name: str, frame: bytes, status: int) -> None:
        await self.writer.end(encode_event(name, frame), status)
