"""Moving one call's bytes to one agent instance, with connect / first-byte / idle / total timeouts.

The router decides; this module only sends and classifies what came back, so every failure
becomes an ErrorCode and a flag saying whether the agent could have seen the request. Calls to
an instance that joined with a registration token are signed with that token's key
(``X-Reach-Signature``), so the agent can refuse calls that did not come through the mesh.
An agent may answer with server-sent events (agent_reach.sse): each chunk is passed on through the
call's Relay as soon as it is read, under the idle timeout between chunks and the call's total.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import time
from typing import Any, Literal

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.atp import (
    BUSINESS_ERROR_SHAPE,
    BusinessError,
    ErrorCode,
    RequestFrame,
    agent_business_error,
    agent_status_code,
)
from agent_reach.exhaustion import local_exhaustion
from agent_reach.headers import (
    COMPLETION_URL_HEADER,
    CONTEXT_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    TIMEOUT_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from agent_reach.registration import Protocol
from agent_reach.signing import sign
from agent_reach.sse import CHUNK, ERROR, EVENT_STREAM, MESSAGE, RESPONSE, EventParser
from agent_reach.usage import Usage, usage_from
from yarl import URL

from router.a2a.outbound import A2AAgents, CardError, Verdict, a2a_request, stream_step, verdict_of
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan

_encoder = msgspec.json.Encoder()

# A rest agent gets the context in one header (X-Reach-Context), so the router's edge refuses a larger
# one: with the other headers it stays well inside the 8 KiB a header line may have at common servers
# (aiohttp, nginx), and a refusal is the caller's, not an agent failure that could open a breaker.
MAX_CONTEXT_BYTES = 4096
# An answer past this is refused while it is read, never buffered whole (RouterSettings.max_answer_bytes).
DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024


class AgentAnswer(msgspec.Struct, kw_only=True):
    """What one attempt produced: a result, or an error code with its story."""

    error_code: ErrorCode | None = None
    message: str = ""
    # False when the request never reached the agent (refused, connect timeout): failing over is safe.
    sent: bool = True
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: BusinessError | None = None
    elapsed_ms: float = 0.0
    # True when the deadline that ended it was not the capability's own (the caller's timeout_hint brought
    # it forward, or the budget ran out before any instance was tried): it says nothing about the agent.
    cut_short: bool = False
    # Chunks of a streamed answer this attempt passed on: after the first, the call is never failed over.
    chunks: int = 0
    # The tokens the agent reported for the call (None: none, or a report the router could not read).
    usage: Usage | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None


class _AgentReply(msgspec.Struct, kw_only=True):
    """The union of an ATP response frame and an error frame, as an agent may send either."""

    status: Literal["success", "error", "busy"] | None = None
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: Any = None  # read by agent_business_error: a numeric code is a business error too
    error_code: str | None = None
    error_message: str = ""
    usage: Any = None  # read by usage_from: a garbled report is dropped, never a failed call


_reply_decoder = peer_json.Decoder(_AgentReply, limit=peer_json.MAX_PASSED_DEPTH)


def _atp_request(frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
    body = _encoder.encode(msgspec.structs.replace(frame, timeout_hint=timeout_hint_ms, intent=None))
    return body, {"Content-Type": "application/json"}


def _rest_request(frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
    headers = {"Content-Type": "application/json", CONTEXT_HEADER: _encoder.encode(frame.context).decode(),
               TIMEOUT_HEADER: str(timeout_hint_ms)}
    return _encoder.encode(frame.payload), headers


# An agent refusing the router's own credentials (its signature) says nothing about the caller's:
# to the caller it is a failing instance, worth trying another one.
_AGENT_REFUSALS = frozenset({ErrorCode.UNAUTHENTICATED.value, ErrorCode.FORBIDDEN.value,
                             ErrorCode.TRUST_LEVEL_INSUFFICIENT.value})
# The codes an agent's frame may carry. INTERNAL_ERROR is the router's own failure, never counted against
# an instance: an agent saying it is answered AGENT_ERROR, or it could pass its failures off as the router's.
_AGENT_CODES = {code.value: code for code in ErrorCode if code is not ErrorCode.INTERNAL_ERROR}


def _failed_status(status: int) -> AgentAnswer:
    """What a status outside 2xx says when the body is no frame (or, for rest, whatever the body)."""
    code = agent_status_code(status)
    refused = code not in (ErrorCode.AGENT_ERROR, ErrorCode.BUSY)
    return AgentAnswer(error_code=code, message=f"agent refused the request (HTTP {status})" if refused
                       else f"agent answered HTTP {status}")


def _malformed(what: str) -> AgentAnswer:
    return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered a malformed answer: {what}")


def _classify_atp(status: int, body: bytes) -> AgentAnswer:
    try:
        reply = _reply_decoder.decode(body)
    except msgspec.MsgspecError as exc:  # an answer nested past any need (peer_json.TooDeep) too
        return _malformed(f"not a frame ({exc})") if 200 <= status < 300 else _failed_status(status)
    if reply.error_code is None and reply.status is None:
        return _malformed("a frame needs status or error_code")
    business = agent_business_error(reply.business_error) if reply.business_error is not None else None
    if business is None and reply.business_error is not None:
        return _malformed(BUSINESS_ERROR_SHAPE)
    if reply.error_code in _AGENT_REFUSALS:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR,
                           message=f"agent refused the router's call ({reply.error_code}): {reply.error_message}")
    if reply.error_code is not None:
        return AgentAnswer(error_code=_AGENT_CODES.get(reply.error_code, ErrorCode.AGENT_ERROR),
                           message=reply.error_message or reply.error_code, business_error=business)
    if business is not None:
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                           business_error=business, result=reply.result)
    if reply.status == "busy":
        return AgentAnswer(error_code=ErrorCode.BUSY, message="agent answered busy")
    if reply.status == "error" or not 200 <= status < 300:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered status error (HTTP {status})")
    return AgentAnswer(result=reply.result, context_update=reply.context_update, usage=usage_from(reply.usage))


_business_decoder = msgspec.json.Decoder(dict[str, Any] | list[Any] | str | int | float | bool | None)
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)


class _RestUsage(msgspec.Struct):
    """A rest answer's top-level ``usage``, read apart from the answer, which is passed on untouched."""

    usage: Any = None


_rest_usage_decoder = msgspec.json.Decoder(_RestUsage)


def _rest_usage(body: bytes) -> Usage | None:
    """The usage a rest answer carries; only answers that name one are read twice (an object's other
    members are skipped, an answer that is no object has none)."""
    if b'"usage"' not in body:
        return None
    try:
        return usage_from(_rest_usage_decoder.decode(body).usage)
    except msgspec.MsgspecError:
        return None


def _classify_rest(status: int, body: bytes) -> AgentAnswer:
    if not 200 <= status < 300:
        return _failed_status(status)
    try:
        peer_json.check(body, peer_json.MAX_PASSED_DEPTH)  # once: both decodes below then stay within it
        if b'"business_error"' not in body:
            # Checked as JSON (syntax, and UTF-8, which Raw does not check), then passed through as bytes:
            # the router has no reason to rebuild it.
            if not body.isascii():
                body.decode()
            return AgentAnswer(result=_raw_decoder.decode(body) if body else None, usage=_rest_usage(body))
        result = _business_decoder.decode(body)
    except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
        return _malformed(f"the body is not JSON ({exc})")
    raw = result.get("business_error") if isinstance(result, dict) else None
    if raw is None:
        return AgentAnswer(result=result, usage=usage_from(result.get("usage")) if isinstance(result, dict) else None)
    business = agent_business_error(raw)
    if business is None:
        return _malformed(BUSINESS_ERROR_SHAPE)
    return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                       business_error=business, result=result)


def _a2a_answer(verdict: Verdict) -> AgentAnswer:
    business = None if verdict.business_code is None else BusinessError(code=verdict.business_code,
                                                                         message=verdict.message)
    return AgentAnswer(error_code=verdict.error_code, message=verdict.message, result=verdict.result,
                       business_error=business)


def _classify_a2a(status: int, body: bytes) -> AgentAnswer:
    return _a2a_answer(verdict_of(body)) if 200 <= status < 300 else _failed_status(status)


_PROTOCOLS = {"atp": (_atp_request, _classify_atp), "rest": (_rest_request, _classify_rest),
              "a2a": (a2a_request, _classify_a2a)}


class _AgentChunk(msgspec.Struct):
    data: msgspec.Raw = msgspec.Raw(b"null")


_chunk_decoder = msgspec.json.Decoder(_AgentChunk)


def _chunk_data(protocol: Protocol, data: bytes) -> msgspec.Raw:
    """A chunk's JSON: an ATP agent's is the ``data`` of its chunk event, a rest agent's the event's data.
    Checked (syntax and UTF-8) before it is passed on inside the router's own event, and on one line:
    a raw line end can only be whitespace between JSON tokens, so a space stands for it."""
    if not data.isascii():
        data.decode()
    peer_json.check(data, peer_json.MAX_PASSED_DEPTH)
    text = bytes(_chunk_decoder.decode(data).data if protocol == "atp" else _raw_decoder.decode(data))
    return msgspec.Raw(text.replace(b"\n", b" ").replace(b"\r", b" "))


def _final(protocol: Protocol, name: str, data: bytes) -> AgentAnswer:
    """What a stream's final event says: ``response`` is read as the protocol's answer, ``error`` as a frame."""
    if name == RESPONSE:
        return _PROTOCOLS[protocol][1](200, data)
    return _classify_atp(502, data)


class _Stream:
    """Where one streamed answer is: which deadline is armed (for naming the timeout that fires) and its size."""

    def __init__(self, idle_s: float, ends_at: float, limit: int):
        self.idle_s = idle_s
        self.ends_at = ends_at
        self.limit = limit
        self.idle_armed = False
        self.size = 0
        self.chunks = 0
        self.agent_task = ""  # an A2A agent's task, cancelled there when the call ends before the stream

    def arm(self, deadline: asyncio.Timeout) -> None:
        """The next read may wait until the idle deadline or the total's, whichever is first."""
        idle_at = asyncio.get_running_loop().time() + self.idle_s
        self.idle_armed = idle_at < self.ends_at
        deadline.reschedule(min(idle_at, self.ends_at))

    def disarm(self, deadline: asyncio.Timeout) -> None:
        """While the caller takes the chunks, only the total runs: a slow reader is not an idle agent."""
        self.idle_armed = False
        deadline.reschedule(self.ends_at)


async def _relay_stream(response: aiohttp.ClientResponse, protocol: Protocol, relay: Relay, stream: _Stream,
                        deadline: asyncio.Timeout) -> AgentAnswer:
    """Read an agent's events, passing each chunk on before the next is read, until its final event."""
    parser = EventParser()
    last = msgspec.Raw(b"null")
    while True:
        stream.arm(deadline)
        received = await response.content.readany()
        if not received:
            if protocol != "rest":
                return _malformed("the stream ended without a final event")
            return AgentAnswer(result=last)
        stream.size += len(received)
        if stream.size > stream.limit:
            return AgentAnswer(error_code=ErrorCode.ANSWER_TOO_LARGE,
                               message=f"agent's streamed answer exceeds the router's limit of {stream.limit} bytes "
                                       f"after {stream.chunks} chunks")
        # The chunks that arrived together go on together (one write), before anything more is read.
        batch: list[msgspec.Raw] = []
        ended: AgentAnswer | None = None
        for event in parser.feed(received):
            if protocol == "a2a":  # JSON-RPC answers as events: chunks in artifact updates, a final state
                step = stream_step(event.name, event.data, batch[-1] if batch else last)
                stream.agent_task = step.task_id or stream.agent_task
                batch.extend(step.chunks)
                if step.final is not None:
                    ended = _a2a_answer(step.final)
                    break
                continue
            if event.name in (RESPONSE, ERROR):
                ended = _final(protocol, event.name, event.data)
                break
            if event.name not in (CHUNK, MESSAGE):
                continue  # an event of another kind (a keep-alive, say): nothing for the caller
            try:
                batch.append(_chunk_data(protocol, event.data))
            except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
                ended = _malformed(f"a chunk is not JSON ({exc})")
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


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
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


def _short_of_resources(exc: BaseException, sent: bool) -> AgentAnswer | None:
    """INTERNAL_ERROR when ``exc`` came of the router running out of descriptors, socket buffers or memory:
    no agent is to blame, and none would fare better; None for any other failure."""
    exhausted = local_exhaustion(exc)
    if exhausted is None:
        return None
    name = errno.errorcode.get(exhausted.errno or 0, str(exhausted.errno))
    happened = "the agent may have received the call" if sent else "nothing was sent"
    return AgentAnswer(error_code=ErrorCode.INTERNAL_ERROR, sent=sent,
                       message=f"the router ran out of a system resource ({name}); {happened}")


class Forwarder:
    """One shared keep-alive connection pool for every agent."""

    def __init__(self, session: aiohttp.ClientSession, completion_url: str | None = None):
        self._session = session
        self.completion_url = completion_url
        self.a2a = A2AAgents(session)

    async def send(self, endpoint: str, protocol: Protocol, frame: RequestFrame, timeouts: ResolvedTimeouts,
                   signing_key: str | None = None, agent_id: str = "",
                   max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES, *, span: CallSpan,
                   relay: Relay | None = None) -> AgentAnswer:
        """``signing_key``: the key of the registration token the instance ``agent_id`` joined with, if any;
        the signature names ``agent_id`` so that it verifies at that instance only. An answer larger than
        ``max_answer_bytes`` (a stream's bytes all together) is ANSWER_TOO_LARGE. ``relay``: where a
        streamed answer's chunks go (a caller that streams asks the agent for a stream)."""
        # One coroutine, not a timing wrapper around another: every await resumes through each frame.
        build, classify = _PROTOCOLS[protocol]
        body, headers = build(frame, int(timeouts.total_s * 1000))
        headers[REQUEST_ID_HEADER] = frame.request_id
        headers[TRACEPARENT_HEADER] = span.traceparent
        if span.tracestate is not None:
            headers[TRACESTATE_HEADER] = span.tracestate
        if signing_key is not None:
            headers[SIGNATURE_HEADER] = sign(signing_key, agent_id, "POST", _path(endpoint), frame.request_id, body)
        if self.completion_url:
            headers[COMPLETION_URL_HEADER] = self.completion_url
        relay = relay or Relay()
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
                # An A2A agent's endpoint is its card, which names where it takes calls.
                url = endpoint if protocol != "a2a" else await self.a2a.rpc_url(endpoint, client_timeout)
                response = await self._session.post(url, data=body, headers=headers, timeout=client_timeout,
                                                    allow_redirects=False)
                stage = "body"
                if first_byte_fires:
                    deadline.reschedule(now + timeouts.total_s)
                if response.status // 100 == 2 and response.content_type == EVENT_STREAM:
                    stage = "stream"
                    answer = await self._stream(response, protocol, relay, stream, deadline)
                else:
                    async with response:
                        raw = await _read_capped(response, max_answer_bytes)
                    answer = classify(response.status, raw) if raw is not None else AgentAnswer(
                        error_code=ErrorCode.ANSWER_TOO_LARGE,
                        message=f"agent's answer exceeds the router's limit of {max_answer_bytes} bytes")
        except CardError as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False, message=str(exc))
        except aiohttp.ConnectionTimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False,
                                 message=f"no connection within {timeouts.connect_s * 1000:.0f} ms")
        except aiohttp.ClientConnectorError as exc:
            answer = _short_of_resources(exc, sent=False) or AgentAnswer(
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
            answer = _short_of_resources(exc, sent=True) or AgentAnswer(
                error_code=ErrorCode.AGENT_ERROR, message=f"agent connection broke: {exc!r}")
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        answer.chunks = stream.chunks
        return answer

    async def _stream(self, response: aiohttp.ClientResponse, protocol: Protocol, relay: Relay, stream: _Stream,
                      deadline: asyncio.Timeout) -> AgentAnswer:
        """A streamed answer; the connection is closed, never reused, when the call ends before its final
        event (a timeout, the caller gone, the cap): that is what stops the agent's work."""
        try:
            answer = await _relay_stream(response, protocol, relay, stream, deadline)
        except BaseException:
            response.close()
            if stream.agent_task:
                self.a2a.cancel(str(response.url), stream.agent_task)
            raise
        response.release()  # closes the connection too unless the stream was read to its end
        return answer
