"""Incoming connections that cannot hold a server hostage: deadlines for a request's header and
body, an idle limit, a cap on how many are open at once, and errors in the mesh's JSON shape.

aiohttp's server closes a connection only after ``keepalive_timeout`` (an hour by default) and
never times out a header or a body that trickles in, so slow clients (slowloris) could hold every
file descriptor the process has. Here each request's header must be complete within
``header_timeout`` of its first byte (or of the connection opening), its body within
``body_timeout`` of its header, and past ``max_connections`` (or past its address's share) a new
connection gets a 503 and is closed as it is accepted, keeping descriptors for the process's own outgoing
calls and its files; near the cap the slowest connections are closed to make room (agent_reach.admission).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import typing
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from agent_reach.admission import Admission, Gate
from agent_reach.exhaustion import Throttle

log = logging.getLogger("agentreach.connections")

_encoder = msgspec.json.Encoder()
# Per process, like the log they feed: a flood of bad or slow connections is a line per interval.
_malformed = Throttle()
_slow_headers = Throttle()


class SlowBody(RequestPayloadError):
    """The request body did not arrive within the body deadline."""


def error_body(code: str, message: str, field: str | None = None) -> dict[str, str | None]:
    """The error envelope every server in the mesh answers in, the SDK's agents and the mesh's own
    parts (weblayer) alike: what went wrong as a code, in words, and which field."""
    return {"error": code, "message": message, "field": field}


def unreadable_body(exc: RequestPayloadError) -> tuple[int, dict[str, str | None]]:
    """The answer for a body that could not be read: too slow (408), or not decodable (400)."""
    if isinstance(exc, SlowBody):
        return 408, error_body("body_timeout", str(exc), "body")
    reason = getattr(exc.__cause__, "message", None) or str(exc)
    return 400, error_body("invalid_body", f"The request body could not be read ({reason}); check Content-Encoding",
                           "body")


def hung_up(request: BaseRequest, exc: BaseException) -> bool:
    """Whether ``exc`` is the caller leaving: a connection error on a request whose connection is gone. Nobody is
    left to answer, and the request handler counts and reports it (``GuardedHandler.connection_lost``)."""
    return isinstance(exc, ConnectionError) and request.transport is None


def error_answer(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body = _encoder.encode(error_body(code, message, field))
    return web.Response(body=body, status=status, content_type="application/json")


def protocol_error(status: int, exc: BaseException | None) -> tuple[str, str]:
    """Code and message for what aiohttp's parser or a handler's escape turned into ``status``."""
    if isinstance(exc, LineTooLong):
        return "line_too_long", (f"A request line or header line is longer than {exc.args[1]} bytes "
                                 "(a URL or one header that long is refused)")
    if isinstance(exc, BadHttpMessage):
        return "bad_request", f"Malformed HTTP request: {exc.message}"
    if status == 504:
        return "timeout", "The request took too long to handle"
    if status < 500:
        return "bad_request", "The request could not be handled"
    return "internal_error", "The server failed to handle this request"


def _too_many(message: str) -> bytes:
    body = _encoder.encode(error_body("too_many_connections", message))
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


_TOO_MANY = _too_many("The server has as many connections open as it accepts; retry shortly")
_REFUSALS = {Admission.FULL: _TOO_MANY,
             Admission.PEER_FULL: _too_many("Your address has as many connections open as the server accepts from "
                                            "one address; reuse one, or retry once one has closed")}
_UNREAD = 65_536


def turn_away(conn: socket.socket, answer: bytes) -> None:
    """A connection refused gets a 503 and is closed, its request never handled. What the client has sent
    already is drained first: closing over unread bytes resets the connection, and a reset can beat the
    answer to the client."""
    with conn:
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(answer)
        with contextlib.suppress(OSError):
            conn.recv(_UNREAD)


class GuardedListener(socket.socket):
    """A listening socket that turns connections its gate refuses away as it accepts them. asyncio
    gives an accepted connection a transport a loop turn later and frees a closed one's descriptor a turn
    after that, so refusals made there piled up while a busy loop kept accepting (EMFILE under load)."""

    __slots__ = ("batch", "gate")

    def __init__(self, family: int, kind: int, proto: int, *, gate: Gate, batch: int):
        super().__init__(family, kind, proto)
        self.gate, self.batch = gate, batch

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(self.batch):
            conn, address = super().accept()  # BlockingIOError once none waits: asyncio then waits for more
            verdict = self.gate.admit(address[0], conn.fileno())
            if verdict is Admission.ADMIT:
                return conn, address
            turn_away(conn, _REFUSALS[verdict])
        raise BlockingIOError(errno.EAGAIN, "a batch was turned away; the loop's other work goes first")


async def bind(host: str, port: int, *, gate: Gate, batch: int, reuse_port: bool) -> list[GuardedListener]:
    """A guarded listening socket on each address ``host`` names, bound as asyncio's ``create_server`` binds."""
    infos = await asyncio.get_running_loop().getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)
    listeners: list[GuardedListener] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            listener = GuardedListener(family, kind, proto, gate=gate, batch=batch)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


class Refusal(asyncio.Protocol):
    """A refusal for a loop that accepts on its own (uvloop), past ``GuardedListener``: a 503 and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports write as asyncio.Transport does without deriving from it.
        typing.cast(asyncio.Transport, transport).write(_TOO_MANY)
        transport.close()


class GuardedHandler(RequestHandler):
    """aiohttp's request handler with header and body deadlines, counted against its listener's gate, which
    it tells when it waits on its client (idle, or a request still arriving) and may then close it for room.
    A caller leaving mid-request is an expected event: counted, reported once per interval, never answered."""

    def __init__(self, manager: web.Server, *, gate: Gate, **kwargs: Any):
        super().__init__(manager, keepalive_timeout=gate.limits.idle_timeout, **kwargs)
        self._limits = gate.limits
        self._gate: Gate | None = gate
        self._header_deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        # From a request's first byte until its answer is out.
        self._mid_request = False
        # The client address this connection counts against.
        self._peer: str | None = None
        gate.open += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._gate is not None:
            sock, peername = transport.get_extra_info("socket"), transport.get_extra_info("peername")
            self._peer = self._gate.entered(sock.fileno() if sock is not None else -1,
                                            peername[0] if peername else None)
        self._await_header()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._gate is not None:
            if self._mid_request and not (self._force_close or self._close):  # the caller's doing, not ours
                self._gate.hung_up(self.peername)
            self._gate.left(self, self._peer)
            self._gate = None  # connection_lost may come twice; count once
        self._cancel_deadlines()
        super().connection_lost(exc)

    def shed(self) -> None:
        """Closed to make room near the cap: at once, whatever the client sent or left unread."""
        transport = self.transport
        self.force_close()
        if transport is not None:
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._upgraded and self._header_deadline is None and self._body_deadline is None:
            # A WebSocket now: its frames are no request header late, and its own pings watch the peer.
            super().data_received(data)
            return
        body = self._body if self._body is not None and not self._body.is_eof() else None
        newest = self._messages[-1] if self._messages else None
        super().data_received(data)
        self._mid_request = self._mid_request or bool(data)
        if self._messages and self._messages[-1] is not newest:
            self._header_complete(self._messages[-1][1])
        elif body is not None:
            if body.is_eof():
                self._busy()
        elif data and self._header_deadline is None:
            self._await_header()

    async def finish_response(self, request: BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        self._cancel(self._body_deadline)
        self._body_deadline = None
        answer = await super().finish_response(request, resp, start_time)
        self._mid_request = bool(self._messages)  # a pipelined request already in
        if request.content.exception() is not None:
            # The rest of a body that failed is not worth reading: close once the answer is out,
            # rather than let aiohttp's lingering read raise the failure again.
            self.force_close()
        elif not (self._mid_request or self._force_close or self._close) and answer[0].keep_alive:
            self._waits()  # idle until the next request
        return answer

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's answer for a request it could not parse or a handler that escaped, as JSON; none for a
        caller that left (the loop serving the connection ends quietly on the ConnectionError)."""
        if exc is not None and hung_up(request, exc):
            raise exc
        if status >= 500:
            log.error("request failed", exc_info=exc, extra={"remote": request.remote, "status": status})
        else:
            _malformed.log(log, logging.WARNING, "malformed requests refused", remote=request.remote,
                           reason=type(exc).__name__ if exc else message)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had started; the connection is closed instead")
        answer = error_answer(status, *protocol_error(status, exc))
        answer.force_close()
        return answer

    def _header_complete(self, body: StreamReader) -> None:
        self._cancel(self._header_deadline)
        self._header_deadline = None
        self._cancel(self._body_deadline)
        self._body, self._body_deadline = body, None
        if body.is_eof():
            self._busy()
        else:
            self._body_deadline = self._loop.call_later(self._limits.body_timeout, self._body_late, body)
            self._waits()

    def _await_header(self) -> None:
        if self.transport is not None:
            self._header_deadline = self._loop.call_later(self._limits.header_timeout, self._header_late)
            self._waits()

    def _waits(self) -> None:
        """From now on waiting on the client: the gate may close this connection for room."""
        if self._gate is not None:
            self._gate.waits(self)

    def _busy(self) -> None:
        """The request is in: the server's to answer, never closed for room."""
        if self._gate is not None:
            self._gate.busy(self)

    def _header_late(self) -> None:
        self._header_deadline = None
        waiting = self._waiter is not None and not self._waiter.done()
        _slow_headers.log(log, logging.WARNING, "connections closed: request header not complete in time",
                          remote=self.peername, timeout_seconds=self._limits.header_timeout)
        # Idle between requests: close now; an answer still being written goes out first.
        self.force_close() if waiting else self.close()

    def _body_late(self, body: StreamReader) -> None:
        self._body_deadline = None
        if not body.is_eof() and body.exception() is None:
            body.set_exception(SlowBody(f"The request body did not arrive within {self._limits.body_timeout:g} s"))

    def _cancel_deadlines(self) -> None:
        for handle in (self._header_deadline, self._body_deadline):
            self._cancel(handle)
        self._header_deadline = self._body_deadline = None
        self._body = None

    @staticmethod
    def _cancel(handle: asyncio.TimerHandle | None) -> None:
        if handle is not None:
            handle.cancel()


class GuardedSite(web.BaseSite):
    """TCP listeners whose connections are GuardedHandlers, turned away at accept when their gate says so."""

    __slots__ = ("_gate", "_handler_args", "_host", "_more", "_port", "_reuse_port")

    def __init__(self, runner: web.AppRunner, host: str, port: int, gate: Gate, *, reuse_port: bool = False,
                 **handler_args: Any):
        """``reuse_port`` (SO_REUSEPORT) lets several processes listen on one port, the kernel spreading
        new connections between them; every one of them must ask for it."""
        super().__init__(runner)
        self._host, self._port = host, port
        self._reuse_port = reuse_port
        self._gate = gate
        self._handler_args = handler_args
        self._more: list[asyncio.Server] = []

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def gate(self) -> Gate:
        return self._gate

    def _connection(self) -> asyncio.Protocol:
        if not self._gate.take():
            return Refusal()
        server = self._runner.server
        assert server is not None
        return GuardedHandler(server, loop=asyncio.get_running_loop(), gate=self._gate, **self._handler_args)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        listeners = await bind(self._host, self._port, gate=self._gate, batch=self._backlog,
                               reuse_port=self._reuse_port)
        servers = [await loop.create_server(self._connection, sock=listener, backlog=self._backlog)
                   for listener in listeners]
        self._server, *self._more = servers

    async def stop(self) -> None:
        for server in self._more:
            server.close()
        await super().stop()
