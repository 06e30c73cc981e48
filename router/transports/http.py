"""One call over HTTP POST, for every protocol that speaks it (atp, rest, a2a): connect / first-byte / idle /
total deadlines on one timer, the answer read within its cap, a server-sent-events answer relayed chunk by
chunk, and every failure an AgentAnswer saying whether the agent could have seen the request. A protocol is a
``Dialect``: how it writes the call and reads the answer and a stream's events. Calls to an instance that joined
with a registration token are signed with that token's key (``X-Reach-Signature``), so the agent can refuse
calls that did not come through the mesh."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import NamedTuple

import aiohttp
import msgspec
from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.headers import (
    COMPLETION_URL_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from agent_reach.signing import sign
from agent_reach.sse import EVENT_STREAM, EventParser
from yarl import URL

from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer, malformed, short_of_resources


class Step(NamedTuple):
    """What one event of a streamed answer says: chunks to pass on, or the answer that ends the stream."""

    chunks: list[msgspec.Raw]
    final: AgentAnswer | None = None
    task_id: str = ""  # the agent's own task, once an event names it: what to cancel if the mesh gives up


class Dialect:
    """How one HTTP protocol writes a call and reads what comes back; the exchange itself is HttpTransport's."""

    def request(self, frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
        """The body and headers a call is sent with."""
        raise NotImplementedError

    def classify(self, status: int, body: bytes) -> AgentAnswer:
        """What a whole (not streamed) answer says."""
        raise NotImplementedError

    def step(self, name: str, data: bytes, last: msgspec.Raw) -> Step:
        """What one event of a streamed answer says; ``last``: the chunk passed on before it."""
        raise NotImplementedError

    def unfinished(self, last: msgspec.Raw) -> AgentAnswer:
        """A stream that ended without a final event: malformed, unless the protocol has none."""
        return malformed("the stream ended without a final event")

    async def target(self, endpoint: str, timeout: aiohttp.ClientTimeout) -> str:
        """Where the call is posted: the registered endpoint, unless the protocol looks it up."""
        return endpoint

    def abandon(self, url: str, task_id: str) -> None:
        """A stream given up before its end (a timeout, the caller gone): stop the agent's own task, if any."""


class _Stream:
    """Where one streamed answer is: which deadline is armed (for naming the timeout that fires) and its size."""

    def __init__(self, idle_s: float, ends_at: float, limit: int):
        self.idle_s = idle_s
        self.ends_at = ends_at
        self.limit = limit
        self.idle_armed = False
        self.size = 0
        self.chunks = 0
        self.agent_task = ""

    def arm(self, deadline: asyncio.Timeout) -> None:
        """The next read may wait until the idle deadline or the total's, whichever is first."""
        idle_at = asyncio.get_running_loop().time() + self.idle_s
        self.idle_armed = idle_at < self.ends_at
        deadline.reschedule(min(idle_at, self.ends_at))

    def disarm(self, deadline: asyncio.Timeout) -> None:
        """While the caller takes the chunks, only the total runs: a slow reader is not an idle agent."""
        self.idle_armed = False
        deadline.reschedule(self.ends_at)


async def _relay_stream(response: aiohttp.ClientResponse, dialect: Dialect, relay: Relay, stream: _Stream,
                        deadline: asyncio.Timeout) -> AgentAnswer:
    """Read an agent's events, passing each chunk on before the next is read, until its final event."""
    parser = EventParser()
    last = msgspec.Raw(b"null")
    while True:
        stream.arm(deadline)
        received = await response.content.readany()
        if not received:
            return dialect.unfinished(last)
        stream.size += len(received)
        if stream.size > stream.limit:
            return AgentAnswer(error_code=ErrorCode.ANSWER_TOO_LARGE,
                               message=f"agent's streamed answer exceeds the router's limit of {stream.limit} bytes "
                                       f"after {stream.chunks} chunks")
        # The chunks that arrived together go on together (one write), before anything more is read.
        batch: list[msgspec.Raw] = []
        ended: AgentAnswer | None = None
        for event in parser.feed(received):
            step = dialect.step(event.name, event.data, batch[-1] if batch else last)
            stream.agent_task = step.task_id or stream.agent_task
            batch.extend(step.chunks)
            if step.final is not None:
                ended = step.final
                break
        if batch:
            stream.disarm(deadline)
            await relay.pass_on(batch)
            stream.chunks += len(batch)
            last = batch[-1]
        if ended is not None:
            return ended


@functools.lru_cache(maxsize=1024)
def _client_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s)


@functools.lru_cache(maxsize=4096)
def _path(endpoint: str) -> str:
    """The path an agent sees for ``endpoint`` (decoded, no query): what the signature binds."""
    return URL(endpoint).path


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The answer's body (decoded), or None as soon as it is known to exceed ``limit``: from Content-Length
    before reading, else while reading; the connection is then closed, so the rest is never received.
    An uncompressed answer whose length is declared within the limit is read at once (the common case,
    ~1 µs less than chunk by chunk); a compressed one is counted as it is decoded, whatever it declares."""
    length = response.content_length
    if length is not None and length > limit:
        response.close()
        return None
    if length is not None and "Content-Encoding" not in response.headers:
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            response.close()
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class HttpTransport:
    """One protocol's calls over the router's shared keep-alive pool of agent connections."""

    def __init__(self, session: aiohttp.ClientSession, dialect: Dialect):
        self._session = session
        self.dialect = dialect
        # Where an agent may report a call's completion (X-Reach-Completion-Url); set once the router listens.
        self.completion_url: str | None = None

    async def close(self) -> None:
        """The pool is the router's: it closes it."""

    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        # One coroutine, not a timing wrapper around another: every await resumes through each frame.
        dialect = self.dialect
        body, headers = dialect.request(frame, int(timeouts.total_s * 1000))
        headers[REQUEST_ID_HEADER] = frame.request_id
        headers[TRACEPARENT_HEADER] = span.traceparent
        if span.tracestate is not None:
            headers[TRACESTATE_HEADER] = span.tracestate
        if signing_key is not None:
            headers[SIGNATURE_HEADER] = sign(signing_key, agent_id, "POST", _path(endpoint), frame.request_id, body)
        if self.completion_url:
            headers[COMPLETION_URL_HEADER] = self.completion_url
        if relay.streaming:
            headers["Accept"] = f"{EVENT_STREAM}, application/json"
        client_timeout = _client_timeout(timeouts.connect_s)
        # One timer for both deadlines: the first byte's, then (headers in) the whole call's.
        now = asyncio.get_running_loop().time()
        started = time.monotonic()
        first_byte_fires = timeouts.first_byte_s < timeouts.total_s
        stage = "first_byte"
        stream = _Stream(timeouts.idle_s, now + timeouts.total_s, max_answer_bytes)
        try:
            async with asyncio.timeout_at(now + min(timeouts.first_byte_s, timeouts.total_s)) as deadline:
                # Never followed: a redirect would send the call (and its signature) wherever the agent says.
                url = await dialect.target(endpoint, client_timeout)
                response = await self._session.post(url, data=body, headers=headers, timeout=client_timeout,
                                                    allow_redirects=False)
                stage = "body"
                if first_byte_fires:
                    deadline.reschedule(now + timeouts.total_s)
                if response.status // 100 == 2 and response.content_type == EVENT_STREAM:
                    stage = "stream"
                    answer = await self._stream(response, relay, stream, deadline)
                else:
                    async with response:
                        raw = await read_capped(response, max_answer_bytes)
                    answer = dialect.classify(response.status, raw) if raw is not None else AgentAnswer(
                        error_code=ErrorCode.ANSWER_TOO_LARGE,
                        message=f"agent's answer exceeds the router's limit of {max_answer_bytes} bytes")
        except Unreachable as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False, message=str(exc))
        except aiohttp.ConnectionTimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False,
                                 message=f"no connection within {timeouts.connect_s * 1000:.0f} ms")
        except aiohttp.ClientConnectorError as exc:
            answer = short_of_resources(exc, sent=False) or AgentAnswer(
                error_code=ErrorCode.AGENT_ERROR, sent=False, message=f"connection failed: {exc}")
        except TimeoutError:
            if stage == "stream" and stream.idle_armed:
                answer = AgentAnswer(error_code=ErrorCode.IDLE_TIMEOUT,
                                     message=f"no chunk for {timeouts.idle_s * 1000:.0f} ms after "
                                             f"{stream.chunks} chunks")
            elif stage == "first_byte" and first_byte_fires:
                answer = AgentAnswer(error_code=ErrorCode.FIRST_BYTE_TIMEOUT,
                                     message=f"no answer within {timeouts.first_byte_s * 1000:.0f} ms")
            else:
                answer = AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT,
                                     message=f"call not finished within {timeouts.total_s * 1000:.0f} ms")
        except aiohttp.ClientError as exc:
            answer = short_of_resources(exc, sent=True) or AgentAnswer(
                error_code=ErrorCode.AGENT_ERROR, message=f"agent connection broke: {exc!r}")
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        answer.chunks = stream.chunks
        return answer

    async def _stream(self, response: aiohttp.ClientResponse, relay: Relay, stream: _Stream,
                      deadline: asyncio.Timeout) -> AgentAnswer:
        """A streamed answer; the connection is closed, never reused, when the call ends before its final
        event (a timeout, the caller gone, the cap): that is what stops the agent's work."""
        try:
            answer = await _relay_stream(response, self.dialect, relay, stream, deadline)
        except BaseException:
            response.close()
            if stream.agent_task:
                self.dialect.abandon(str(response.url), stream.agent_task)
            raise
        response.release()  # closes the connection too unless the stream was read to its end
        return answer


class Unreachable(Exception):
    """Where the call should go cannot be learned (an A2A agent's card): nothing was sent to the agent."""
