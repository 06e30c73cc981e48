"""Server-sent events, as streamed answers travel: agent → router → caller.

A stream is zero or more ``event: chunk`` events, each ``{"request_id", "seq", "data"}``, then exactly
one ``event: response`` (a response frame) or ``event: error`` (an error frame). One encoder and one
incremental parser for every hop, so an event means the same thing on each. A rest agent's plain SSE
(``data:`` lines without an event name) reads as chunks whose ``data`` is the event's JSON itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec
from aiohttp import web

EVENT_STREAM = "text/event-stream"
CHUNK, RESPONSE, ERROR = "chunk", "response", "error"
# The event name an unnamed SSE event has (the SSE standard's default).
MESSAGE = "message"
# Headers of every streamed answer: nothing between the hops may hold the events back.
STREAM_HEADERS = {"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Chunk(msgspec.Struct, kw_only=True):
    """One partial result; ``data`` travels as the JSON it came in (the router never rebuilds it)."""

    request_id: str
    seq: int
    data: msgspec.Raw = msgspec.Raw(b"null")


class ChunkFrame(msgspec.Struct, kw_only=True):
    """One chunk as a caller reads it (``ReachClient.stream``), its data decoded."""

    request_id: str
    seq: int
    data: Any = None


class Event(NamedTuple):
    name: str
    data: bytes


_encoder = msgspec.json.Encoder()


def encode_event(name: str, data: bytes) -> bytes:
    """One event; ``data`` is JSON as msgspec writes it, which holds no raw newline."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def chunk_event(request_id: str, seq: int, data: msgspec.Raw) -> bytes:
    return encode_event(CHUNK, _encoder.encode(Chunk(request_id=request_id, seq=seq, data=data)))


def wants_stream(accept: str) -> bool:
    """Whether an Accept header asks for server-sent events."""
    return EVENT_STREAM in accept


class EventParser:
    """Events out of a byte stream fed as it arrives (``\\n``, ``\\r\\n`` or ``\\r`` line ends, cut anywhere).
    Comments and fields other than ``event`` and ``data`` are skipped, as the SSE standard says. Pieces
    without a line end are only kept, and joined once one comes: a long line costs linear time."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._name = ""
        self._data: list[bytes] = []

    def feed(self, received: bytes) -> list[Event]:
        self._pending.append(received)
        if b"\n" not in received and b"\r" not in received:
            return []
        text = b"".join(self._pending)
        # A final \r may be the first half of \r\n: it is kept until the next byte says.
        held = b"\r" if text.endswith(b"\r") else b""
        *lines, rest = text[:len(text) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._pending = [rest + held] if rest or held else []
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(Event(self._name or MESSAGE, b"\n".join(self._data)))
                self._name, self._data = "", []
                continue
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"event":
                self._name = value.decode(errors="replace")
            elif field == b"data":
                self._data.append(value)
        return events


@contextlib.contextmanager
def on_disconnect(request: web.BaseRequest, callback: Callable[[], Any]) -> Iterator[bool]:
    """Run ``callback`` the moment the client's connection is lost, while the block runs; yields
    whether that can be watched. aiohttp cancels nothing when a client leaves (and its servers run
    without handler cancellation: a late result is still worth a completion notice), so a stream whose
    producer is silent would never learn its reader left: the connection's ``connection_lost`` is
    wrapped for the block. The mesh's servers (GuardedSite) allow it; a plain aiohttp handler is slotted,
    and there a lost reader shows at the next write instead."""
    transport, protocol = request.transport, request.protocol
    if transport is None or transport.is_closing():
        callback()
        yield True
        return
    lost = protocol.connection_lost

    def hooked(exc: BaseException | None) -> None:
        try:
            lost(exc)
        finally:
            callback()

    try:
        protocol.connection_lost = hooked  # type: ignore[method-assign]
    except AttributeError:
        yield False
        return
    try:
        yield True
    finally:
        if vars(protocol).get("connection_lost") is hooked:
            del protocol.connection_lost


class EventWriter:
    """A streamed answer opened only with its first event, so the answer's status can still be an
    error's when nothing was streamed. Writes to a reader that left raise ConnectionResetError."""

    def __init__(self, request: web.BaseRequest, headers: dict[str, str]):
        self.request = request
        self.headers = headers
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    def watch(self, caller_gone: Callable[[], Any]) -> contextlib.AbstractContextManager[bool]:
        return on_disconnect(self.request, caller_gone)

    async def chunk(self, request_id: str, seq: int, data: msgspec.Raw) -> None:
        await self.send(chunk_event(request_id, seq, data))

    async def open(self, status: int = 200) -> web.StreamResponse:
        if self.response is None:
            response = web.StreamResponse(status=status, headers={**STREAM_HEADERS, **self.headers})
            await response.prepare(self.request)
            self.response = response
        return self.response

    async def send(self, event: bytes, status: int = 200) -> None:
        await (await self.open(status)).write(event)

    async def end(self, event: bytes, status: int = 200) -> web.StreamResponse:
        """The final event; ``status`` applies only when nothing was streamed before it."""
        response = await self.open(status)
        with contextlib.suppress(ConnectionError):
            await response.write(event)
            await response.write_eof()
        return response
