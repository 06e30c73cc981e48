"""The HTTP clients the router calls agents with, behind one small interface (``AgentClients.call``
gives a ``Reply``), so router/forward.py reads as the call's logic.

Most calls go through pyreqwest (reqwest and hyper, in Rust, on a runtime thread of their own), which
costs less CPU per call than aiohttp's client (docs/benchmarks.md). pyreqwest cannot stop a request
whose awaiting task was cancelled before the agent's headers came: it lets it run until the request's
own timeout. Each request carries the call's total as that timeout, so when the first byte's deadline
is the total's (no ``first_byte_ms`` shorter than the total: the default) the connection closes when
the router gives up, as it did on aiohttp; a caller who leaves before the agent's headers came leaves
the agent's connection open until then (on aiohttp it closed at once). A call with an earlier
first-byte deadline must close the connection at that deadline while its body may still take until
the total (an agent that answers after it learns the router gave up, and reports the result as late):
reqwest has no such deadline, so those calls go through the router's aiohttp session. Either way,
leaving the call's context before the answer was read to its end closes the connection (never
returned to the pool).

pyreqwest specifics:

- reqwest sets the connect timeout per client, not per request: one client (its own keep-alive pool)
  per connect timeout a policy names, all on pyreqwest's one runtime. A call whose connect timeout was
  cut to its first-byte deadline (the caller's hint, the budget left) needs none: that deadline ends the
  connect as soon, so it takes the client without one.
- Its errors carry their causes as text: ``failure_of`` tells a connect timeout, an agent that could
  not be reached and a broken exchange apart, ``exhausted_errno`` finds the router's own lack of
  descriptors or memory in ``(os error 24)``.
- What aiohttp did stays: redirects never followed, gzip and deflate decoded (no brotli or zstd,
  which aiohttp here did not decode either), keep-alive 30 s, no limit on connections per agent.
"""

from __future__ import annotations

import enum
import functools
import re
from datetime import timedelta
from types import TracebackType

import aiohttp
from agent_reach.exhaustion import EXHAUSTION_ERRNOS, local_exhaustion
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import ConnectError, ConnectTimeoutError, RequestError
from pyreqwest.request import StreamRequest
from pyreqwest.response import Response

from mesh.policy import DEFAULT_CONNECT_MS
from router.timeouts import ResolvedTimeouts

KEEPALIVE = timedelta(seconds=30)
# A cause naming the connect phase: the client's connect timeout and a failed connect say so; the
# request's own total timeout, which pyreqwest also raises as ConnectTimeoutError while no header came,
# and a connection reset after the request was written (a ConnectError) do not.
_CONNECTING = "client error (Connect)"
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _build(connect_s: float | None) -> Client:
    builder = (ClientBuilder().follow_redirects(False).brotli(False).zstd(False)
               .pool_idle_timeout(KEEPALIVE).max_connections(None))
    if connect_s is not None:
        builder = builder.connect_timeout(timedelta(seconds=connect_s))
    return builder.build()


@functools.lru_cache(maxsize=1024)
def aiohttp_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for a call or an A2A card: the connect's only, the call's deadlines are asyncio's."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s)


class Reply:
    """An agent's answer being read: status and content type at once, the body as it comes.
    ``length``: the body's length as it will be read, when declared (None when the client decodes it:
    the Content-Length counted the compressed bytes)."""

    __slots__ = ("content_type", "length", "status")

    def __init__(self, status: int, content_type: str | None, length: int | None):
        self.status = status
        self.content_type = content_type
        self.length = length

    async def read(self) -> bytes:
        """The whole body."""
        raise NotImplementedError

    async def chunk(self) -> bytes | None:
        """The next piece of the body as it was received; None at its end."""
        raise NotImplementedError


class _ReqwestReply(Reply):
    __slots__ = ("_response",)

    def __init__(self, response: Response):
        mime = response.content_type_mime()
        declared = response.get_header("Content-Length")
        super().__init__(response.status, None if mime is None else mime.essence_str,
                         int(declared) if declared is not None and declared.isdigit() else None)
        self._response = response

    async def read(self) -> bytes:
        return (await self._response.bytes()).to_bytes()

    async def chunk(self) -> bytes | None:
        received = await self._response.body_reader.read_chunk()
        return None if received is None else received.to_bytes()


class _AiohttpReply(Reply):
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse):
        length = response.content_length if "Content-Encoding" not in response.headers else None
        super().__init__(response.status, response.content_type, length)
        self._response = response

    async def read(self) -> bytes:
        return await self._response.read()

    async def chunk(self) -> bytes | None:
        return await self._response.content.readany() or None


class _ReqwestCall:
    """A call on pyreqwest: leaving its context closes the body reader, and with it the connection
    unless the answer was read to its end."""

    __slots__ = ("_request",)

    def __init__(self, request: StreamRequest):
        self._request = request

    async def __aenter__(self) -> Reply:
        return _ReqwestReply(await self._request.__aenter__())

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._request.__aexit__(kind, exc, tb)


class _AiohttpCall:
    """A call on aiohttp: the connection is closed when the call's context is left by an exception
    (a deadline, the caller gone), released otherwise (kept only if the answer was read to its end)."""

    __slots__ = ("_args", "_response")

    def __init__(self, session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                 connect_s: float):
        self._args = (session, url, body, headers, connect_s)
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> Reply:
        session, url, body, headers, connect_s = self._args
        self._response = await session.post(url, data=body, headers=headers, timeout=aiohttp_timeout(connect_s),
                                            allow_redirects=False)
        return _AiohttpReply(self._response)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._response is not None
        if kind is None:
            self._response.release()
        else:
            self._response.close()


class AgentClients:
    """The clients for calls to agents: pyreqwest's, one per connect timeout, and the router's aiohttp
    session; made by whoever runs the router (RouterServer), which closes them once no call is left."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        # Built now, not at a call: a router out of descriptors cannot build a client (the test of
        # that runs every call on these two).
        self._clients: dict[float | None, Client] = {None: _build(None),
                                                     DEFAULT_CONNECT_MS / 1000: _build(DEFAULT_CONNECT_MS / 1000)}

    def client(self, connect_s: float, first_byte_s: float) -> Client:
        """The pyreqwest client whose connect timeout is ``connect_s``, or the one without any when the
        first-byte deadline comes no later. Keys are policies' connect_ms (operators'), never a caller's number."""
        key = connect_s if connect_s < first_byte_s else None
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = _build(key)
        return client

    def call(self, url: str, body: bytes, headers: dict[str, str], timeouts: ResolvedTimeouts,
             left_s: float) -> _ReqwestCall | _AiohttpCall:
        """A POST whose ``Reply`` comes with the agent's headers, its body read as it comes (no body held
        back to fill a buffer); ``left_s``: the time left to the call's total."""
        if timeouts.first_byte_s < timeouts.total_s:
            return _AiohttpCall(self.session, url, body, headers, timeouts.connect_s)
        return _ReqwestCall(self.client(timeouts.connect_s, timeouts.first_byte_s).post(url).headers(headers)
                            .body_bytes(body).streamed_read_buffer_limit(0)
                            .timeout(timedelta(seconds=max(left_s, 0.001))).build_streamed())

    async def close(self) -> None:
        """pyreqwest's clients; the aiohttp session is its owner's to close."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


class Failure(enum.Enum):
    """What an exception out of a call to an agent says happened."""

    CONNECT_TIMEOUT = "connect_timeout"  # no connection within the connect timeout: nothing was sent
    UNREACHED = "unreached"  # the connection failed (refused, no route, out of descriptors): nothing was sent
    TIMEOUT = "timeout"  # one of the call's own deadlines: which one is the forwarder's to say
    BROKEN = "broken"  # the exchange broke after the request may have reached the agent


def failure_of(exc: TimeoutError | RequestError | aiohttp.ClientError) -> Failure:
    """The kind of ``exc``, raised by pyreqwest's client, aiohttp's (an A2A agent's card is read with
    it) or a deadline of the call's."""
    if isinstance(exc, ConnectTimeoutError | ConnectError):
        # pyreqwest names errors by their text: a connection reset, or closed, after the request was
        # written is a ConnectError too. Only the connect phase's own (its cause says so) sent nothing.
        connecting = any(cause["message"] == _CONNECTING for cause in exc.details.get("causes") or ())
        if isinstance(exc, ConnectTimeoutError):
            return Failure.CONNECT_TIMEOUT if connecting else Failure.TIMEOUT
        return Failure.UNREACHED if connecting else Failure.BROKEN
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return Failure.CONNECT_TIMEOUT
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Failure.UNREACHED
    if isinstance(exc, TimeoutError):
        return Failure.TIMEOUT
    return Failure.BROKEN


def described(exc: BaseException) -> str:
    """``exc`` for a message: pyreqwest's with its deepest cause (``connection error: Connection refused
    (os error 111)``), which says what happened where its own message does not."""
    if isinstance(exc, RequestError):
        causes = exc.details.get("causes") or ()
        return f"{exc.message}: {causes[-1]['message']}" if causes else exc.message
    return repr(exc)


def exhausted_errno(exc: BaseException) -> int | None:
    """The errno saying the router ran out of descriptors, socket buffers or memory, if ``exc`` came of
    that: in pyreqwest's causes (``Too many open files (os error 24)``) or a Python exception's chain."""
    if isinstance(exc, RequestError):
        for cause in exc.details.get("causes") or ():
            found = _OS_ERROR.search(cause["message"])
            if found is not None and int(found.group(1)) in EXHAUSTION_ERRNOS:
                return int(found.group(1))
        return None
    exhausted = local_exhaustion(exc)
    return None if exhausted is None else exhausted.errno
