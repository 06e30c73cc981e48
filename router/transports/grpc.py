"""gRPC agents (``protocol: "grpc"``, agent_reach.grpc_wire): one channel per instance endpoint, opened on the
first call and reused, ``Call`` for a caller that does not stream and ``CallStream`` for one that does.

The timeouts mean what they mean over HTTP: connect bounds the channel getting ready (when it is not), first
byte the first message (a unary call's reply), idle the gap between streamed messages, total the whole call
(the gRPC deadline the agent sees too). A channel that cannot connect fails the call unsent (failing over is
safe; gRPC then waits out a back-off before it tries that endpoint again, failing calls at once meanwhile); a
call lost once sent (UNAVAILABLE on a ready channel) is a broken exchange, retried only if idempotent. A call
given up (a timeout, the caller gone) is cancelled, which the agent sees as its handler cancelled. A status
reads as the ATP code the agent sent with it, else by grpc_wire's table.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.grpc_wire import (
    CALL_METHOD,
    CODE_OF,
    ERROR_CODE_TRAILER,
    STREAM_METHOD,
    call_request,
    chunk_event,
    error_frame,
    metadata,
    reply_frame,
)
from agent_reach.headers import (
    COMPLETION_URL_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from agent_reach.proto.agent_pb2 import CallEvent, CallReply
from agent_reach.signing import GRPC_SIGNED_PATH, sign
from google.protobuf.message import DecodeError

from mesh.egress import Egress
from mesh.grpc_dial import allowed_target, open_channel
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer, malformed, short_of_resources
from router.transports.atp import AtpDialect, classify_frame
from router.transports.base import IDLE_CLOSE_S
from router.transports.deadlines import Deadlines

# What grpc-core says when an answer is over the channel's receive limit (it sets RESOURCE_EXHAUSTED, also BUSY's).
_TOO_LARGE = "larger than max"
_READY = grpc.ChannelConnectivity.READY


class _Unreachable(ConnectionError):
    """The channel could not connect (refused, reset, backing off after a failure): nothing was sent."""


class _Channel:
    def __init__(self, channel: grpc.aio.Channel):
        self.channel = channel
        self.used_at = time.monotonic()
        self.calls = 0


class GrpcTransport:
    def __init__(self, egress: Egress):
        self._egress = egress
        self._channels: dict[str, _Channel] = {}
        # Channels of idle endpoints being closed, held until they are.
        self._closing: set[asyncio.Task[None]] = set()
        self._dialect = AtpDialect()
        # Where an agent may report a call's completion (X-Reach-Completion-Url); set once the router listens.
        self.completion_url: str | None = None

    @property
    def connections(self) -> int:
        """Channels connected to agents now."""
        return sum(held.channel.get_state() is _READY for held in self._channels.values())

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        await asyncio.gather(*(held.channel.close() for held in channels.values()), return_exceptions=True)

    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeouts.connect_s):
                held = await self._ready(endpoint, max_answer_bytes)
        except TimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False,
                                 message=f"gRPC channel not ready within {timeouts.connect_s * 1000:.0f} ms")
        except (OSError, ValueError) as exc:
            answer = short_of_resources(exc, sent=False) or AgentAnswer(
                error_code=ErrorCode.AGENT_ERROR, sent=False, message=f"gRPC connection failed: {exc}")
        else:
            held.calls += 1
            try:
                answer = await self._call(held.channel, endpoint, frame, timeouts, signing_key, agent_id,
                                          max_answer_bytes, span, relay)
            finally:
                held.calls -= 1
                held.used_at = time.monotonic()
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        return answer

    async def _ready(self, endpoint: str, max_answer_bytes: int) -> _Channel:
        """The endpoint's channel once it is ready, opened by the first call that finds none."""
        held = self._channels.get(endpoint)
        if held is None:
            self._close_idle()
            target = await allowed_target(self._egress, endpoint)
            held = self._channels.setdefault(endpoint, _Channel(open_channel(target, endpoint, max_answer_bytes)))
        state = held.channel.get_state(try_to_connect=True)
        while state is not _READY:
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                raise _Unreachable(f"no connection to {endpoint} (it failed; gRPC retries it after a back-off)")
            await held.channel.wait_for_state_change(state)
            state = held.channel.get_state(try_to_connect=True)
        return held

    def _close_idle(self) -> None:
        idle_since = time.monotonic() - IDLE_CLOSE_S
        for endpoint, held in list(self._channels.items()):
            if held.used_at < idle_since and held.calls == 0:
                del self._channels[endpoint]
                closing = asyncio.get_running_loop().create_task(held.channel.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    def _metadata(self, endpoint: str, frame: RequestFrame, body: bytes, signing_key: str | None, agent_id: str,
                  span: CallSpan) -> tuple[tuple[str, str], ...]:
        headers = {REQUEST_ID_HEADER: frame.request_id, TRACEPARENT_HEADER: span.traceparent}
        if span.tracestate is not None:
            headers[TRACESTATE_HEADER] = span.tracestate
        if signing_key is not None:
            headers[SIGNATURE_HEADER] = sign(signing_key, agent_id, "POST", GRPC_SIGNED_PATH, frame.request_id, body)
        if self.completion_url:
            headers[COMPLETION_URL_HEADER] = self.completion_url
        return metadata(headers)

    async def _call(self, channel: grpc.aio.Channel, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts,
                    signing_key: str | None, agent_id: str, max_answer_bytes: int, span: CallSpan,
                    relay: Relay) -> AgentAnswer:
        body = call_request(frame)
        options: dict[str, Any] = {"timeout": timeouts.total_s,
                                   "metadata": self._metadata(endpoint, frame, body, signing_key, agent_id, span)}
        deadlines = Deadlines(timeouts)
        if relay.streaming:
            streamed = channel.unary_stream(STREAM_METHOD, _as_sent, _as_received)(body, **options)
            return await _cancelled_unless_done(streamed, self._stream(streamed, frame, deadlines,
                                                                       max_answer_bytes, relay))
        unary = channel.unary_unary(CALL_METHOD, _as_sent, _as_received)(body, **options)
        return await _cancelled_unless_done(unary, self._unary(unary, deadlines, max_answer_bytes))

    async def _unary(self, call: grpc.aio.UnaryUnaryCall[bytes, bytes], deadlines: Deadlines,
                     max_answer_bytes: int) -> AgentAnswer:
        wait_s, waits_for = deadlines.next_wait(0)
        try:
            async with asyncio.timeout(wait_s):
                raw = await call
        except TimeoutError:
            return deadlines.timed_out(waits_for, 0)
        except grpc.aio.AioRpcError as exc:
            return _failed(exc, deadlines, 0, max_answer_bytes)
        if len(raw) > max_answer_bytes:
            return _too_large(max_answer_bytes, 0)
        try:
            reply = CallReply.FromString(raw)
        except DecodeError as exc:
            return malformed(f"not an agentreach.v1.CallReply ({exc})")
        return classify_frame(200, reply_frame(reply))

    async def _stream(self, call: grpc.aio.UnaryStreamCall[bytes, bytes], frame: RequestFrame, deadlines: Deadlines,
                      max_answer_bytes: int, relay: Relay) -> AgentAnswer:
        chunks = size = 0
        while True:
            wait_s, waits_for = deadlines.next_wait(chunks)
            try:
                async with asyncio.timeout(wait_s):
                    raw = await call.read()
            except TimeoutError:
                return deadlines.timed_out(waits_for, chunks)
            except grpc.aio.AioRpcError as exc:
                return _failed(exc, deadlines, chunks, max_answer_bytes)
            if not isinstance(raw, bytes):  # grpc.aio.EOF
                return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, chunks=chunks,
                                   message=f"agent's stream ended without a reply (after {chunks} chunks)")
            size += len(raw)
            if size > max_answer_bytes:
                return _too_large(max_answer_bytes, chunks)
            try:
                event = CallEvent.FromString(raw)
            except DecodeError as exc:
                answer = malformed(f"not an agentreach.v1.CallEvent ({exc})")
                answer.chunks = chunks
                return answer
            if event.HasField("reply"):
                answer = classify_frame(200, reply_frame(event.reply))
                answer.chunks = chunks
                return answer
            try:
                chunk = self._dialect.chunk(chunk_event(frame.request_id, event.chunk))
            except (ValueError, UnicodeDecodeError) as exc:
                return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, chunks=chunks,
                                   message=f"agent answered a malformed answer: a chunk is not JSON ({exc})")
            await relay.pass_on([chunk])
            chunks += 1


def _as_sent(message: bytes) -> bytes:
    """Requests go as call_request encoded them (and signed them); answers are parsed here, checked."""
    return message


_as_received = _as_sent


async def _cancelled_unless_done(call: grpc.aio.Call, answering: Any) -> AgentAnswer:
    """The call's answer; a call the router stops waiting for (a timeout, the caller gone) is cancelled, which
    ends the agent's handler too."""
    try:
        answer: AgentAnswer = await answering
        return answer
    finally:
        if not call.done():
            call.cancel()


def _too_large(limit: int, chunks: int) -> AgentAnswer:
    return AgentAnswer(error_code=ErrorCode.ANSWER_TOO_LARGE, chunks=chunks,
                       message=f"agent's answer exceeds the router's limit of {limit} bytes")


def _failed(exc: grpc.aio.AioRpcError, deadlines: Deadlines, chunks: int, max_answer_bytes: int) -> AgentAnswer:
    """What a status ends the call with."""
    status, details = exc.code(), exc.details() or ""
    sent_code = dict(exc.trailing_metadata() or ()).get(ERROR_CODE_TRAILER)
    if status is grpc.StatusCode.DEADLINE_EXCEEDED and sent_code is None:
        answer = deadlines.timed_out("total", chunks)
    elif status is grpc.StatusCode.RESOURCE_EXHAUSTED and sent_code is None and _TOO_LARGE in details:
        answer = _too_large(max_answer_bytes, chunks)
    elif status is grpc.StatusCode.UNAVAILABLE and sent_code is None:
        answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, chunks=chunks,
                             message=f"the agent's gRPC connection was lost with the call on it ({details}; "
                                     f"after {chunks} chunks)")
    else:
        code = sent_code if isinstance(sent_code, str) else CODE_OF.get(status, ErrorCode.AGENT_ERROR).value
        answer = classify_frame(502, error_frame(code, details or f"gRPC status {status.name}"))
        answer.chunks = chunks
    return answer
