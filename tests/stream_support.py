"""Reading a streamed answer as a caller does (server-sent events over real HTTP), with the moment each
event arrived, and a plain aiohttp agent whose stream a test scripts event by event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from agent_reach.sse import EventParser, on_disconnect
from aiohttp import web

from agent_support import CallEndpoint
from recording_support import Received, RecordingServer


class Streamed:
    """What a caller read: the status, each event with its arrival time (monotonic), and the final one."""

    def __init__(self, status: int, content_type: str):
        self.status = status
        self.content_type = content_type
        self.events: list[tuple[str, Any, float]] = []

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [data for name, data, _ in self.events if name == "chunk"]

    @property
    def arrivals(self) -> list[float]:
        return [at for name, _, at in self.events if name == "chunk"]

    @property
    def final(self) -> tuple[str, dict[str, Any]]:
        finals = [(name, data) for name, data, _ in self.events if name != "chunk"]
        assert len(finals) == 1 and self.events[-1][0] == finals[0][0], self.events
        return finals[0]


async def read_stream(http: aiohttp.ClientSession, url: str, frame: dict[str, Any],
                      headers: dict[str, str] | None = None,
                      on_chunk: Callable[[Streamed], Awaitable[bool]] | None = None) -> Streamed:
    """POST ``frame`` asking for a stream and read its events as they come; ``on_chunk`` returning True
    stops reading and hangs up (a caller that leaves)."""
    async with http.post(url, json=frame, headers={"Accept": "text/event-stream", **(headers or {})}) as response:
        streamed = Streamed(response.status, response.content_type)
        parser = EventParser()
        async for received in response.content.iter_any():
            for event in parser.feed(received):
                streamed.events.append((event.name, json.loads(event.data), time.monotonic()))
                if event.name == "chunk" and on_chunk is not None and await on_chunk(streamed):
                    response.close()
                    return streamed
        return streamed


class Drop(Exception):
    """Raised by a script: the agent dies mid-answer, its connection reset without the stream's end."""


Script = Callable[[web.StreamResponse], Awaitable[None]]


class StreamingRestAgent(CallEndpoint, RecordingServer):
    """A rest agent answering ``text/event-stream`` as ``script`` writes it (a coroutine given the
    prepared response); ``left`` is set when the router closed the connection under it."""

    protocol = "rest"

    def __init__(self, name: str, script: Script):
        super().__init__(self._answer)
        self.name = name
        self.script = script
        self.left = asyncio.Event()

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        script = asyncio.ensure_future(self.script(response))
        with on_disconnect(request, script.cancel):
            try:
                await script
                await response.write_eof()
            except (ConnectionError, asyncio.CancelledError):
                self.left.set()
            except Drop:
                assert request.transport is not None
                request.transport.abort()
        return response


def sse(name: str | None, data: Any) -> bytes:
    """One event as a rest agent writes it (no name: a plain ``data:`` event)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()
