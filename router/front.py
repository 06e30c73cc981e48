"""`--http-front granian`: Granian (a Rust HTTP server, RSGI) on the router's public port, in the router's
own event loop. POST /atp is served natively by an RSGI edge of the one call logic (api.py's `Atp`);
every other path (admin API, OAuth, A2A, metrics) is passed through, streamed, to the router's aiohttp
app listening on a private unix socket, so each keeps exactly one implementation.

What aiohttp's GuardedSite does and Granian maps: the header read deadline (``header_read_timeout``), the
connection cap (``backpressure``: past it connections wait in the backlog instead of getting a 503), the
body deadline (here, around the body's read). Not mapped: the idle keep-alive limit (Granian 2.8 has none
for HTTP/1) and GuardedSite's JSON answers for unparsable requests (Granian answers those by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import cast

import aiohttp
import msgspec
from agent_reach.connections import Gate, Limits, bind
from agent_reach.headers import TRACESTATE_HEADER
from agent_reach.sse import STREAM_HEADERS
from aiohttp import web
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian._granian import RSGIHTTPStreamTransport, RSGIProtocolClosed, RSGIProtocolError, SocketHolder
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.rsgi import Scope
from granian.server.embed import Server

from router.api import ATP_KEY, MAX_HEADER_BYTES, MAX_HEADER_LINE, headers_too_large
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.router.front")

_encoder = msgspec.json.Encoder()
_JSON = [("content-type", "application/json")]
# Not forwarded either way: they describe one connection, not the request (Content-Length is recomputed).
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "content-length"})
# Granian writes its own.
_ANSWER_ONLY = _HOP_BY_HOP | {"server", "date"}
BACKLOG = 128
# How long a stopping front waits for calls in progress.
STOP_SECONDS = 5.0


def header_bytes(scope: Scope) -> int:
    return sum(len(name) + len(value) for name, value in scope.headers.items())


async def read_body(proto: HTTPProtocol, scope: Scope, max_body: int, timeout: float) -> bytes | None:
    """The whole body, or None past ``max_body``: refused by its declared length before a byte is read, or
    as soon as a chunked body passes it. Granian holds a body to its declared length."""
    try:
        async with asyncio.timeout(timeout):
            declared = scope.headers.get("content-length")
            if declared is not None:
                return await proto() if int(declared) <= max_body else None
            chunks, size = [], 0
            async for chunk in proto:
                size += len(chunk)
                if size > max_body:
                    return None
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"The request body did not arrive within {timeout:g} s", "body") from None
    except (RSGIProtocolError, RSGIProtocolClosed) as exc:
        raise ApiError(400, "invalid_body", f"The request body could not be read ({exc})", "body") from None


def answer_error(proto: HTTPProtocol, error: ApiError) -> None:
    proto.response_bytes(error.status, [*_JSON, *(error.headers or {}).items()], _encoder.encode(error.body()))


class RsgiEvents:
    """A streamed answer on Granian, opened with its first event (so its status can still be an error's)."""

    __slots__ = ("headers", "proto", "transport")

    def __init__(self, proto: HTTPProtocol, headers: dict[str, str]):
        self.proto = proto
        self.headers = headers
        self.transport: RSGIHTTPStreamTransport | None = None

    async def send(self, event: bytes, status: int = 200) -> None:
        if self.transport is None:
            self.transport = self.proto.response_stream(status, [*STREAM_HEADERS.items(), *self.headers.items()])
        try:
            await self.transport.send_bytes(event)
        except RSGIProtocolClosed as exc:
            raise ConnectionResetError("the caller left") from exc

    async def end(self, event: bytes, status: int = 200) -> None:
        with contextlib.suppress(ConnectionError):
            await self.send(event, status)


@contextlib.contextmanager
def watch_disconnect(proto: HTTPProtocol, callback: Callable[[], object]) -> Iterator[bool]:
    watch = asyncio.ensure_future(proto.client_disconnect())
    watch.add_done_callback(lambda done: None if done.cancelled() else callback())
    try:
        yield True
    finally:
        watch.cancel()


class RsgiEdge:
    """POST /atp on Granian: api.py's `Edge`."""

    __slots__ = ("front", "headers", "proto", "scope", "stream")

    def __init__(self, front: GranianFront, scope: Scope, proto: HTTPProtocol):
        self.front = front
        self.scope = scope
        self.proto = proto
        # RSGIHeaders answers get and `in` case-insensitively: all the call path asks of its headers.
        self.headers = cast(Mapping[str, str], scope.headers)
        self.stream: RsgiEvents | None = None

    def tracestate(self) -> str:
        return ",".join(self.scope.headers.get_all(TRACESTATE_HEADER))  # type: ignore[attr-defined]

    async def read(self) -> bytes | None:
        return await read_body(self.proto, self.scope, self.front.max_body, self.front.limits.body_timeout)

    def json(self, body: bytes, status: int, headers: Mapping[str, str]) -> None:
        self.proto.response_bytes(status, [*_JSON, *headers.items()], body)

    def empty(self, status: int) -> None:
        self.proto.response_empty(status, [])

    def events(self, headers: dict[str, str]) -> RsgiEvents:
        self.stream = RsgiEvents(self.proto, headers)
        return self.stream

    def on_disconnect(self, callback: Callable[[], object]) -> contextlib.AbstractContextManager[object]:
        return watch_disconnect(self.proto, callback)

    def streamed(self) -> None:
        if self.stream is None or self.stream.transport is None:
            # The caller left before any event: an answer Granian can close the exchange with, read by nobody.
            with contextlib.suppress(RSGIProtocolError, RSGIProtocolClosed):
                self.proto.response_empty(200, [])


class _EmbeddedServer(Server):
    """Granian's embedded server on a socket bound here: port 0, SO_REUSEPORT only when asked (Granian sets
    it on every socket it binds itself, which would let a second router join this one's port silently)."""

    def __init__(self, target: GranianFront, holder: SocketHolder, limits: Limits):
        self._holder = holder
        super().__init__(target, interface=Interfaces.RSGI, http=HTTPModes.http1, websockets=False,
                         log_enabled=False, backlog=BACKLOG, backpressure=limits.max_connections,
                         http1_settings=HTTP1Settings(header_read_timeout=int(limits.header_timeout * 1000),
                                                      max_buffer_size=MAX_HEADER_LINE))

    def _init_shared_socket(self) -> None:
        self._ssp = None
        self._shd = self._holder  # type: ignore[assignment]


class GranianFront:
    """Granian on the public host:port before the router's aiohttp app, which listens on a private unix
    socket (mode 0600 in a 0700 directory of its own)."""

    def __init__(self, app: web.Application, host: str, port: int, *, max_body: int, reuse_port: bool = False,
                 limits: Limits | None = None):
        self.atp = app[ATP_KEY]
        self.app = app
        self.host, self.port = host, port
        self.max_body = max_body
        self.reuse_port = reuse_port
        self.limits = limits or Limits()
        self._directory: Path | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._server: _EmbeddedServer | None = None
        self._serving: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Serve; returns the port bound (``port=0`` picks a free one)."""
        self._directory = Path(tempfile.mkdtemp(prefix="agentreach-router-"))
        path = self._directory / "app.sock"
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0,
                                     max_line_size=MAX_HEADER_LINE, max_field_size=MAX_HEADER_LINE)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(path)).start()
        path.chmod(0o600)
        self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path), limit=0),
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
                                              skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        first, *others = await bind(self.host, self.port, gate=Gate(self.limits.max_connections), batch=1,
                                    reuse_port=self.reuse_port)
        for other in others:
            log.warning("the granian front serves one address; not listening on the others %s resolves to",
                        self.host, extra={"address": other.getsockname()})
            other.close()
        first.listen(BACKLOG)
        self.port = first.getsockname()[1]
        # Granian owns the descriptor from here (it closes it when it stops); Linux's holder takes the backlog.
        holder = SocketHolder(first.detach(), False, BACKLOG)  # type: ignore[call-arg]
        self._server = _EmbeddedServer(self, holder, self.limits)
        self._serving = asyncio.create_task(self._server.serve())
        return self.port

    async def stop(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.stop()  # type: ignore[no-untyped-call]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._serving, STOP_SECONDS)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    async def __call__(self, scope: Scope, proto: HTTPProtocol) -> None:
        try:
            if scope.method == "POST" and scope.path == "/atp":
                await self.call(scope, proto)
            else:
                await self.pass_through(scope, proto)
        except ApiError as error:
            answer_error(proto, error)
        except Exception:
            log.exception("unhandled error", extra={"path": scope.path})
            with contextlib.suppress(RSGIProtocolError, RSGIProtocolClosed):
                answer_error(proto, ApiError(500, "internal_error", "The router failed to handle this request"))

    async def call(self, scope: Scope, proto: HTTPProtocol) -> None:
        size = header_bytes(scope)
        if size > MAX_HEADER_BYTES:
            raise headers_too_large(size)
        await self.atp.serve(RsgiEdge(self, scope, proto))

    async def pass_through(self, scope: Scope, proto: HTTPProtocol) -> None:
        """Any other request to the aiohttp app as it came (its body bounded by max_body), its answer
        streamed back as it is read."""
        assert self._session is not None
        body = await read_body(proto, scope, self.max_body, self.limits.body_timeout)
        if body is None:
            raise ApiError(413, "payload_too_large", f"Request body exceeds the router's limit of {self.max_body} "
                                                     "bytes")
        target = f"http://router{scope.path}" + (f"?{scope.query_string}" if scope.query_string else "")
        headers = [(name, value) for name, value in scope.headers.items() if name not in _HOP_BY_HOP]
        transport = None
        try:
            async with self._session.request(scope.method, target, headers=headers, data=body,
                                             allow_redirects=False) as upstream:
                answer = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in upstream.raw_headers
                          if name.decode("latin-1").lower() not in _ANSWER_ONLY]
                transport = proto.response_stream(upstream.status, answer)
                async for chunk in upstream.content.iter_any():
                    await transport.send_bytes(chunk)
        except aiohttp.ClientError as exc:
            log.error("the router's own app did not answer", extra={"path": scope.path, "error": repr(exc)})
            if transport is None:
                raise ApiError(502, "bad_gateway", "The router failed to handle this request") from None
        except RSGIProtocolClosed:
            pass  # the caller left: leaving the block closed the upstream answer, which tells the app
