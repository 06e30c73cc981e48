"""Serving one ATP frame: exactly one answer per call, whatever the handler does.

The handler runs as its own task under the call's deadline (``timeout_hint``, else the declared
``timeout_sla_ms``). It may return (a result), raise :class:`BusinessFailure` (a declared business
error, HTTP 200), raise anything else (``AGENT_ERROR``) or overrun (``TOTAL_TIMEOUT``, task
cancelled). Frames that are malformed or too big never reach the handler, nor do calls the
guard refuses (not signed by the router; ``UNAUTHENTICATED``), and while the agent is stopping
or full every new call gets a ``BUSY`` answer.

A handler that is an async generator streams: each ``yield`` is one chunk, written at once as an
``event: chunk`` when the frame asks for a stream (``"stream": true``), and the last chunk is the final
result (all a caller that does not stream receives). A streamed call whose caller hangs up is cancelled
at once: the handler sees ``CancelledError`` at its next await.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

import msgspec

from agent_reach import logs, peer_json
from agent_reach.atp import BusinessError, ErrorCode, RequestFrame, ResponseFrame, error_frame
from agent_reach.context import CallContext, incoming_context, serving
from agent_reach.guard import CallGuard
from agent_reach.headers import COMPLETION_URL_HEADER, REQUEST_ID_HEADER
from agent_reach.inflight import Inflight
from agent_reach.registration import Capability

log = logging.getLogger("agentreach.sdk")

Handler = Callable[[Any, CallContext], Awaitable[Any] | AsyncIterator[Any]]

_encoder = msgspec.json.Encoder()
_frames = peer_json.Decoder(RequestFrame)


class BusinessFailure(Exception):
    """Raise from a handler for a well-formed answer the caller cannot use (counts as a failure)."""

    def __init__(self, code: str, message: str = "", details: Any = None):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.details = details


class ChunkOut(Protocol):
    """Where a streamed answer's chunks go as the handler yields them: server-sent events on the call's HTTP
    answer (agent_reach.sse.EventWriter), messages on the router's WebSocket (agent_reach.socket_serving) or on
    the call's gRPC stream (agent_reach.grpc_serving)."""

    def watch(self, caller_gone: Callable[[], Any]) -> AbstractContextManager[Any]:
        """While the block runs, ``caller_gone`` is called the moment the caller is known to have left."""
        ...

    async def chunk(self, request_id: str, seq: int, data: msgspec.Raw) -> None:
        """Send one chunk; raises ConnectionError when the caller left."""
        ...


class LateCompletion(msgspec.Struct, kw_only=True):
    """Sent to the router's completion URL: the handler succeeded, but after the caller stopped waiting."""

    request_id: str
    agent_id: str
    # How long after the call arrived the handler finished.
    finished_ms: float


LateNotice = Callable[[str, LateCompletion], None]


class Native(NamedTuple):
    """A capability the SDK serves itself: what is registered, and the function that does the work."""

    capability: Capability
    handler: Handler


class Reply(NamedTuple):
    status: int
    body: bytes


def error_reply(request_id: str, code: ErrorCode, message: str) -> Reply:
    return Reply(code.http_status, _encoder.encode(error_frame(request_id, code, message)))


def _payload_size(frame: RequestFrame, body: bytes, limit: int) -> int:
    """The payload's encoded size; re-encoded only when the whole body is over the limit."""
    return len(body) if len(body) <= limit else len(_encoder.encode(frame.payload))


class Dispatcher:
    def __init__(self, agent_id: str, inflight: Inflight, report_late: LateNotice, guard: CallGuard):
        self.agent_id = agent_id
        self.inflight = inflight
        self._report_late = report_late
        self._guard = guard
        self._tasks: set[asyncio.Task[Any]] = set()

    async def handle(self, native: Native | None, name: str, body: bytes | None, headers: Mapping[str, str],
                     caller_gone: Callable[[], bool] = lambda: False, out: ChunkOut | None = None,
                     signed: bytes | None = None, verified: bool = False) -> Reply:
        """Answer one POST to /atp/{name}; ``body`` is None when it exceeded the size the server reads.

        ``caller_gone`` tells whether the caller hung up (e.g. the router's first-byte timeout fired
        before our deadline): a result it will never read is reported as a late completion too.
        ``out``: where a streaming handler's chunks are written when the frame asks for a stream; the
        Reply is then the final event's frame once ``out.started``. ``signed``: the bytes the router's
        signature covers when they are not ``body`` (a gRPC call's message, agent_reach.grpc_wire). ``verified``:
        the protocol's server checked the signature itself (an mq call is signed for its stream, not for this
        instance).
        """
        request_id = headers.get(REQUEST_ID_HEADER, "")
        if native is None:
            return error_reply(request_id, ErrorCode.UNKNOWN_CAPABILITY, f"This agent has no capability {name!r}")
        limit = native.capability.max_payload_bytes
        if body is None:
            return error_reply(request_id, ErrorCode.PAYLOAD_TOO_LARGE, f"Payload over {limit} bytes")
        refused = None if verified else self._guard.refusal(name, "POST", headers, body if signed is None else signed)
        if refused is not None:
            return error_reply(request_id, ErrorCode.UNAUTHENTICATED, refused)
        try:
            frame = _frames.decode(body)
        except msgspec.DecodeError as exc:
            return error_reply(request_id, ErrorCode.INVALID_FRAME, f"Not a request frame: {exc}")
        if frame.capability not in (None, name):
            return error_reply(frame.request_id, ErrorCode.INVALID_FRAME,
                          f"Frame names capability {frame.capability!r} but was sent to {name!r}")
        if _payload_size(frame, body, limit) > limit:
            return error_reply(frame.request_id, ErrorCode.PAYLOAD_TOO_LARGE, f"Payload over {limit} bytes")
        if self.inflight.refuses():
            why = "stopping" if self.inflight.draining else f"at its limit of {self.inflight.limit} calls"
            return error_reply(frame.request_id, ErrorCode.BUSY, f"Agent {self.agent_id} is {why}")
        slot = self.inflight.enter(frame.request_id, name)
        try:
            with logs.bind(request_id=frame.request_id, capability=name):
                return await self._run(native, frame, headers, caller_gone,
                                       out if frame.stream and inspect.isasyncgenfunction(native.handler) else None)
        finally:
            self.inflight.leave(slot)

    async def _run(self, native: Native, frame: RequestFrame, headers: Mapping[str, str],
                   caller_gone: Callable[[], bool], out: ChunkOut | None) -> Reply:
        budget_ms = frame.timeout_hint if frame.timeout_hint is not None else native.capability.timeout_sla_ms
        started = time.monotonic()
        deadline = started + budget_ms / 1000
        call = CallContext(frame.request_id, native.capability.name, incoming_context(frame.context, headers),
                           deadline=deadline)
        task = asyncio.create_task(self._invoke(native.handler, frame.payload, call, out))
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        try:
            with out.watch(task.cancel) if out is not None else contextlib.nullcontext():
                await asyncio.wait({task}, timeout=max(budget_ms / 1000, 0))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if out is not None and task.cancelled() and caller_gone():  # not the agent's failure: not counted as one
            log.info("caller left a streamed call; handler cancelled")
            return error_reply(frame.request_id, ErrorCode.BUSY, "The caller left before the call finished")
        if not task.done():
            task.cancel()
            self.inflight.count_outcome("timeout", call.tokens_reported)
            log.warning("handler overran its deadline; cancelled", extra={"budget_ms": budget_ms})
            return error_reply(frame.request_id, ErrorCode.TOTAL_TIMEOUT,
                               f"Handler did not finish within {budget_ms} ms")
        finished = time.monotonic()
        reply = self._reply(task, call)
        completion_url = headers.get(COMPLETION_URL_HEADER)
        if completion_url and reply.status == 200 and (finished > deadline or caller_gone()):
            self._report_late(completion_url, LateCompletion(request_id=frame.request_id, agent_id=self.agent_id,
                                                             finished_ms=round((finished - started) * 1000, 3)))
        log.debug("call handled", extra={"status": reply.status, "elapsed_ms": round((finished - started) * 1000, 3)})
        return reply

    def _forget(self, task: asyncio.Task[Any]) -> None:
        """Drop a finished handler task, retrieving its outcome so an abandoned one is never reported unread."""
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()

    @staticmethod
    async def _invoke(handler: Handler, payload: Any, call: CallContext, out: ChunkOut | None) -> Any:
        with serving(call):
            answer = handler(payload, call)
            if not isinstance(answer, AsyncIterator):
                return await answer
            return await _chunks(answer, call.request_id, out)

    def _reply(self, task: asyncio.Task[Any], call: CallContext) -> Reply:
        outcome, reply = self._outcome(task, call)
        self.inflight.count_outcome(outcome, call.tokens_reported)
        return reply

    def _outcome(self, task: asyncio.Task[Any], call: CallContext) -> tuple[str, Reply]:
        if task.cancelled():
            return "error", error_reply(call.request_id, ErrorCode.BUSY, "Agent stopped before the call finished")
        failure = task.exception()
        if failure is not None and not isinstance(failure, BusinessFailure):
            log.error("handler raised", exc_info=failure)
            return "error", error_reply(call.request_id, ErrorCode.AGENT_ERROR, f"{type(failure).__name__}: {failure}")
        update = {**call.context_update, "tokens_used": call.tokens_spent} if call.tokens_spent else call.context_update
        if failure is None:
            outcome, frame = "ok", ResponseFrame(request_id=call.request_id, status="success", result=task.result(),
                                                 context_update=update or None, usage=call.usage)
        else:
            business = BusinessError(code=failure.code, message=failure.message, details=failure.details)
            outcome, frame = "business_error", ResponseFrame(request_id=call.request_id, status="error",
                                                             business_error=business, context_update=update or None)
        try:
            return outcome, Reply(200, _encoder.encode(frame))
        except (TypeError, msgspec.EncodeError) as exc:
            log.error("handler answered something that is not JSON", extra={"error": str(exc)})
            return "error", error_reply(call.request_id, ErrorCode.AGENT_ERROR, f"Answer is not JSON-encodable: {exc}")

    def abandon(self) -> int:
        """Cancel every handler still running (the drain deadline passed); each caller gets BUSY."""
        for task in self._tasks:
            task.cancel()
        return len(self._tasks)


async def _chunks(chunks: AsyncIterator[Any], request_id: str, out: ChunkOut | None) -> Any:
    """Run a streaming handler to its end, writing each chunk as it comes when ``out`` is given (a chunk
    that is not JSON ends the call as the handler's failure); the last chunk is the result."""
    last = None
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        seq = 0
        async for last in chunks:
            if out is not None:
                try:
                    await out.chunk(request_id, seq, msgspec.Raw(_encoder.encode(last)))
                except ConnectionError:
                    raise asyncio.CancelledError("the caller left while the answer streamed") from None
                seq += 1
    return last
