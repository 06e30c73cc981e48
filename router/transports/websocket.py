"""WebSocket agents (``protocol: "websocket"``, agent_reach.socket_wire): one connection per instance endpoint,
opened by the router on the first call and kept, every call multiplexed on it by request_id.

The timeouts mean what they mean over HTTP: connect bounds opening the connection (when none is open), first
byte the first message for the call, idle the gap between chunks, total the whole call. A connection that
cannot be opened fails the call unsent (failing over is safe), and the next attempt at that endpoint waits out
a back-off; a connection lost with calls on it (closed, or a ping unanswered) answers each of them as a broken
exchange (the agent may have run it: retried only if idempotent). A call given up (a timeout, the caller gone)
sends ``cancel`` so the agent stops its handler. A message for no call in flight is logged and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aiohttp
from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.headers import (
    COMPLETION_URL_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from agent_reach.signing import sign
from agent_reach.socket_wire import (
    CALL,
    CANCEL,
    CHUNK,
    MAX_ENVELOPE_BYTES,
    PING_INTERVAL_S,
    REPLY,
    Envelope,
    WireError,
    decode,
    encode,
)
from yarl import URL

from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer, short_of_resources
from router.transports.atp import AtpDialect
from router.transports.base import IDLE_CLOSE_S
from router.transports.exchange import Exchange, Received

log = logging.getLogger("agentreach.router.websocket")

# After a failed connect, how long the next attempt at that endpoint waits (doubling up to the last).
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
# How long telling an agent to cancel may take (one that stopped reading is not waited on).
_CANCEL_SEND_S = 0.5
# Reading has no timeout of its own (each call has its deadlines); a close handshake is not waited on for long.
_SOCKET_TIMEOUT = aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2.0)


class _Link:
    """The router's connection to one endpoint and the calls in flight on it, each a queue of its messages."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.socket: aiohttp.ClientWebSocketResponse | None = None
        self.calls: dict[str, asyncio.Queue[Received]] = {}
        self.opening: asyncio.Future[aiohttp.ClientWebSocketResponse] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.used_at = time.monotonic()

    def drop(self) -> None:
        """Give the connection up: its reader ends (every call on it is lost) and closes it."""
        if self.reader is not None:
            self.reader.cancel()

    async def read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        """Hand each message to its call until the connection ends; then every call still on it is lost."""
        lost = "it closed"
        try:
            async for message in socket:
                if message.type is aiohttp.WSMsgType.ERROR:  # a ping unanswered, a message past the cap
                    lost = f"it failed: {message.data!r}"
                    log.warning("websocket_connection_failed", extra={"endpoint": self.endpoint, "error": lost})
                    break
                if message.type is not aiohttp.WSMsgType.BINARY:
                    continue
                try:
                    envelope, body = decode(message.data)
                except WireError as exc:
                    log.warning("websocket_message_refused", extra={"endpoint": self.endpoint, "why": str(exc)})
                    continue
                queue = self.calls.get(envelope.id) if envelope.type in (CHUNK, REPLY) else None
                if queue is None:
                    log.warning("websocket_message_refused", extra={
                        "endpoint": self.endpoint, "request_id": envelope.id,
                        "why": f"a {envelope.type!r} message for no call in flight on this connection"})
                    continue
                queue.put_nowait((envelope, body))
        finally:
            if self.socket is socket:
                self.socket = None
            for queue in self.calls.values():
                queue.put_nowait(lost)
            if not socket.closed:
                await socket.close()


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _write(socket: aiohttp.ClientWebSocketResponse, message: bytes, within_s: float) -> None:
    """Send ``message``, waiting at most ``within_s`` for the connection to take it. The write is a task of its
    own, only its waiting given up: aiohttp's writers on one connection share one wait for the buffer to drain,
    and cancelling it would fail every other call writing at that moment. The message is in the connection's
    buffer once the task starts, whatever becomes of the wait."""
    writing = asyncio.ensure_future(socket.send_bytes(message))
    writing.add_done_callback(_retrieved)
    async with asyncio.timeout(within_s):
        await asyncio.shield(writing)


class WebSocketTransport:
    def __init__(self, session: aiohttp.ClientSession):
        self._session = session
        self._links: dict[str, _Link] = {}
        # Readers of idle links being closed, held until they finish.
        self._closing: set[asyncio.Task[None]] = set()
        self._dialect = AtpDialect()
        # Where an agent may report a call's completion (X-Reach-Completion-Url); set once the router listens.
        self.completion_url: str | None = None

    @property
    def connections(self) -> int:
        return sum(link.socket is not None for link in self._links.values())

    async def close(self) -> None:
        readers = [link.reader for link in self._links.values() if link.reader is not None] + list(self._closing)
        for reader in readers:
            reader.cancel()  # its end closes the connection
        await asyncio.gather(*readers, return_exceptions=True)
        self._links.clear()

    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        started = time.monotonic()
        link = self._link(endpoint)
        try:
            async with asyncio.timeout(timeouts.connect_s):
                socket = await self._open(link, max_answer_bytes)
        except TimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False,
                                 message=f"no WebSocket connection within {timeouts.connect_s * 1000:.0f} ms")
        except (aiohttp.ClientError, OSError) as exc:
            answer = short_of_resources(exc, sent=False) or AgentAnswer(
                error_code=ErrorCode.AGENT_ERROR, sent=False, message=f"WebSocket connection failed: {exc}")
        else:
            answer = await self._call(link, socket, endpoint, frame, timeouts, signing_key, agent_id,
                                      max_answer_bytes, span, relay)
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        return answer

    def _link(self, endpoint: str) -> _Link:
        link = self._links.get(endpoint)
        if link is None:
            self._close_idle()
            link = self._links[endpoint] = _Link(endpoint)
        link.used_at = time.monotonic()
        return link

    def _close_idle(self) -> None:
        idle_since = time.monotonic() - IDLE_CLOSE_S
        for endpoint, link in list(self._links.items()):
            if link.used_at < idle_since and not link.calls:
                del self._links[endpoint]
                if link.reader is not None:
                    link.reader.cancel()  # its end closes the connection
                    self._closing.add(link.reader)
                    link.reader.add_done_callback(self._closing.discard)

    async def _open(self, link: _Link, max_answer_bytes: int) -> aiohttp.ClientWebSocketResponse:
        """The link's open connection, opened by the first call that finds none (the others wait for it)."""
        if link.socket is not None and not link.socket.closed:
            return link.socket
        if link.opening is None:
            if time.monotonic() < link.retry_at:
                raise aiohttp.ClientConnectionError(
                    f"the last connection attempt failed; the next is made in {link.retry_at - time.monotonic():.2f} s")
            link.opening = asyncio.get_running_loop().create_task(self._connect(link, max_answer_bytes))
            # Its failure is read by each call awaiting it, if any still does (a call that timed out does not).
            link.opening.add_done_callback(_retrieved)
        return await asyncio.shield(link.opening)

    async def _connect(self, link: _Link, max_answer_bytes: int) -> aiohttp.ClientWebSocketResponse:
        try:
            socket = await self._session.ws_connect(link.endpoint, heartbeat=PING_INTERVAL_S, autoping=True,
                                                    max_msg_size=max_answer_bytes + MAX_ENVELOPE_BYTES,
                                                    timeout=_SOCKET_TIMEOUT)
        except BaseException:
            link.retry_at = time.monotonic() + BACKOFF_S[min(link.failures, len(BACKOFF_S) - 1)]
            link.failures += 1
            raise
        finally:
            link.opening = None
        link.failures = 0
        link.socket = socket
        link.reader = asyncio.get_running_loop().create_task(link.read(socket))
        return socket

    async def _call(self, link: _Link, socket: aiohttp.ClientWebSocketResponse, endpoint: str, frame: RequestFrame,
                    timeouts: ResolvedTimeouts, signing_key: str | None, agent_id: str, max_answer_bytes: int,
                    span: CallSpan, relay: Relay) -> AgentAnswer:
        body, _ = self._dialect.request(frame, int(timeouts.total_s * 1000))
        headers = {REQUEST_ID_HEADER: frame.request_id, TRACEPARENT_HEADER: span.traceparent}
        if span.tracestate is not None:
            headers[TRACESTATE_HEADER] = span.tracestate
        if signing_key is not None:
            headers[SIGNATURE_HEADER] = sign(signing_key, agent_id, "POST", URL(endpoint).path, frame.request_id, body)
        if self.completion_url:
            headers[COMPLETION_URL_HEADER] = self.completion_url
        if frame.request_id in link.calls:
            return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False,
                               message="a call with this request_id is in flight to this instance already")
        queue: asyncio.Queue[Received] = asyncio.Queue()
        link.calls[frame.request_id] = queue
        exchange = Exchange(timeouts, max_answer_bytes)
        try:
            # An agent that stops reading holds a write up once the buffers fill: it counts against the first byte.
            await _write(socket, encode(Envelope(type=CALL, id=frame.request_id, headers=headers), body),
                         min(timeouts.first_byte_s, timeouts.total_s))
        except ConnectionError as exc:
            link.calls.pop(frame.request_id, None)
            return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False,
                               message=f"WebSocket connection closed before the call was sent: {exc}")
        except TimeoutError:
            link.calls.pop(frame.request_id, None)
            link.drop()  # an agent that does not read gets nothing more: its calls end, its buffers go
            return exchange.timed_out("first_byte" if timeouts.first_byte_s < timeouts.total_s else "total")
        try:
            return await exchange.answer(queue, relay, self._dialect)
        finally:
            link.calls.pop(frame.request_id, None)
            if not exchange.ended and not socket.closed:  # the router gave up (a timeout, the caller gone, the cap)
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await _write(socket, encode(Envelope(type=CANCEL, id=frame.request_id)), _CANCEL_SEND_S)
