"""The router's client for calls to agents (router/agent_client.py, pyreqwest), against real sockets on
127.0.0.1: which failure an error is, a client per connect timeout, the router's own lack of descriptors
found in pyreqwest's causes, and when a cancelled request's connection closes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from agent_reach.atp import ErrorCode, RequestFrame
from pyreqwest.exceptions import ConnectError, ConnectTimeoutError, RequestError

from agent_support import SlowConnectTarget
from router.agent_client import AgentClients, Failure, described, exhausted_errno, failure_of
from router.forward import AgentAnswer, Forwarder
from router.timeouts import ResolvedTimeouts
from router.tracecontext import open_span
from test_hardening_serving import descriptors_exhausted


class Silent:
    """An agent that reads a request and answers only what ``head`` says (nothing: it never answers), or
    resets the connection then (``reset``); ``closed`` is set when the router closed the connection, at
    ``closed_at``."""

    def __init__(self, head: bytes = b"") -> None:
        self.head = head
        self.reset = False
        self.received = 0
        self.closed = asyncio.Event()
        self.closed_at = 0.0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.received += 1
        if self.reset:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        writer.write(self.head)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.closed_at = time.monotonic()
        self.closed.set()
        writer.close()


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    agent = Silent()
    server = await asyncio.start_server(agent._serve, "127.0.0.1", 0)
    agent.port = server.sockets[0].getsockname()[1]
    async with server:
        yield agent


@pytest.fixture
async def agents(http: aiohttp.ClientSession) -> AsyncIterator[AgentClients]:
    clients = AgentClients(http)
    yield clients
    await clients.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def timeouts(connect_s: float, total_s: float, first_byte_s: float | None = None) -> ResolvedTimeouts:
    return ResolvedTimeouts(connect_s=connect_s, first_byte_s=total_s if first_byte_s is None else first_byte_s,
                            total_s=total_s)


async def raised(clients: AgentClients, url: str, connect_s: float, total_s: float) -> RequestError:
    """What pyreqwest raised for a call with these timeouts (the first byte's deadline the total's)."""
    with pytest.raises(RequestError) as caught:
        async with clients.call(url, b"{}", {}, timeouts(connect_s, total_s), total_s):
            pass
    return caught.value


async def test_a_refused_connection_is_an_unreached_agent_and_says_why(agents):
    error = await raised(agents, f"http://127.0.0.1:{free_port()}/", 1.0, 3.0)
    assert isinstance(error, ConnectError) and failure_of(error) is Failure.UNREACHED
    assert described(error) == "connection error: Connection refused (os error 111)"
    assert exhausted_errno(error) is None


async def test_the_clients_connect_timeout_is_a_connect_timeout_and_the_requests_total_is_not(agents, silent):
    target = await SlowConnectTarget().start()
    try:
        started = time.monotonic()
        error = await raised(agents, f"http://127.0.0.1:{target.port}/", 0.15, 3.0)
        assert 0.14 <= time.monotonic() - started < 1.5
        assert isinstance(error, ConnectTimeoutError) and failure_of(error) is Failure.CONNECT_TIMEOUT
    finally:
        target.close()
    # Connected, no answer: pyreqwest raises the request's own total as a ConnectTimeoutError too.
    error = await raised(agents, f"http://127.0.0.1:{silent.port}/", 1.0, 0.2)
    assert isinstance(error, ConnectTimeoutError) and failure_of(error) is Failure.TIMEOUT


async def test_a_connection_reset_after_the_request_was_sent_is_a_broken_exchange_never_unreached(agents, silent):
    """pyreqwest raises it as a ConnectError: read as unreached, the call would count as never sent and
    be tried again elsewhere although this agent may have run it."""
    silent.reset = True
    url = f"http://127.0.0.1:{silent.port}/"
    error = await raised(agents, url, 1.0, 3.0)
    assert isinstance(error, ConnectError) and failure_of(error) is Failure.BROKEN, described(error)
    answer, _ = await forwarded(agents, url, timeouts(1.0, 3.0))
    assert (answer.error_code, answer.sent) == (ErrorCode.AGENT_ERROR, True), answer
    assert "Connection reset by peer" in answer.message and silent.received == 2


def test_a_client_per_connect_timeout_and_none_for_a_connect_cut_to_the_first_byte(agents):
    assert agents.client(0.15, 2.0) is agents.client(0.15, 5.0)
    assert agents.client(0.15, 2.0) is not agents.client(0.4, 2.0)
    assert agents.client(1.0, 2.0) is not agents.client(0.15, 2.0)
    # A connect timeout cut to the first-byte deadline (the hint, the budget left) adds no client.
    assert agents.client(0.3, 0.3) is agents.client(0.7, 0.7)
    assert agents.client(0.3, 0.3) not in (agents.client(0.3, 2.0), agents.client(1.0, 2.0))


async def forwarded(agents: AgentClients, url: str, limits: ResolvedTimeouts) -> tuple[AgentAnswer, float]:
    started = time.monotonic()
    answer = await Forwarder(agents).send(url, "rest", RequestFrame(capability="echo", payload=1), limits,
                                          span=open_span({}, None))
    return answer, time.monotonic() - started


@pytest.mark.parametrize(("limits", "code", "sent"), [
    (timeouts(0.1, 3.0), ErrorCode.CONNECT_TIMEOUT, False),
    (timeouts(0.4, 3.0), ErrorCode.CONNECT_TIMEOUT, False),
    # Cut to the call's deadline: that deadline ends the connect, as it did on aiohttp.
    (timeouts(0.3, 0.3), ErrorCode.TOTAL_TIMEOUT, True),
    # An earlier first-byte deadline: the call goes through aiohttp, its connect timeout per request.
    (timeouts(0.2, 3.0, first_byte_s=2.0), ErrorCode.CONNECT_TIMEOUT, False),
    (timeouts(0.3, 3.0, first_byte_s=0.3), ErrorCode.FIRST_BYTE_TIMEOUT, True),
])
async def test_each_connect_timeout_is_kept(agents, limits, code, sent):
    target = await SlowConnectTarget().start()
    try:
        answer, elapsed = await forwarded(agents, f"http://127.0.0.1:{target.port}/", limits)
    finally:
        target.close()
    assert (answer.error_code, answer.sent) == (code, sent), answer
    assert limits.connect_s - 0.01 <= elapsed < limits.connect_s + 1.0, elapsed


async def test_running_out_of_descriptors_is_found_in_pyreqwests_causes(agents, silent):
    url = f"http://127.0.0.1:{silent.port}/"
    with descriptors_exhausted():
        error = await raised(agents, url, 1.0, 3.0)
        answer, _ = await forwarded(agents, url, timeouts(1.0, 3.0))
    assert "Too many open files (os error 24)" in described(error)
    assert exhausted_errno(error) == errno.EMFILE and failure_of(error) is Failure.UNREACHED
    assert (answer.error_code, answer.sent) == (ErrorCode.INTERNAL_ERROR, False) and "EMFILE" in answer.message


async def test_a_request_cancelled_before_the_answer_closes_its_connection_by_the_calls_total(agents, silent):
    """pyreqwest lets a request whose awaiting task was cancelled run on: its own timeout (the call's
    total) is what closes the connection then."""
    async def call() -> None:
        async with agents.call(f"http://127.0.0.1:{silent.port}/", b"{}", {}, timeouts(1.0, 0.8), 0.8):
            pass
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call(), 0.2)
    await asyncio.wait_for(silent.closed.wait(), 5)
    assert silent.closed_at - started < 3.0


async def test_a_request_cancelled_once_the_answer_began_closes_its_connection_at_once(agents, silent):
    silent.head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    headers_in = asyncio.Event()

    async def call() -> None:
        async with agents.call(f"http://127.0.0.1:{silent.port}/", b"{}", {}, timeouts(1.0, 30.0), 30.0) as reply:
            headers_in.set()
            await reply.chunk()
    calling = asyncio.ensure_future(call())
    await asyncio.wait_for(headers_in.wait(), 5)
    calling.cancel()
    cancelled = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await calling
    await asyncio.wait_for(silent.closed.wait(), 5)
    assert silent.closed_at - cancelled < 1.0


async def test_a_call_with_an_earlier_first_byte_deadline_closes_its_connection_at_that_deadline(agents, silent):
    """So an agent answering later learns the router gave up (the SDK then reports its result as late)."""
    answer, elapsed = await forwarded(agents, f"http://127.0.0.1:{silent.port}/", timeouts(1.0, 30.0, first_byte_s=0.2))
    assert answer.error_code is ErrorCode.FIRST_BYTE_TIMEOUT and 0.19 <= elapsed < 1.2, (answer, elapsed)
    await asyncio.wait_for(silent.closed.wait(), 1.0)
