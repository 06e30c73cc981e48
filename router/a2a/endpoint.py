"""The router's A2A face: Agent Cards, and A2A JSON-RPC calls run as ATP calls through the same Router.

``GET /a2a/{capability}/.well-known/agent-card.json`` and ``GET /.well-known/agent-card.json`` (the
catalog) answer cards; ``POST /a2a/{capability}`` and ``POST /a2a`` (the catalog's endpoint) take
SendMessage, SendStreamingMessage, GetTask and CancelTask (and their v0.3 names). The caller's
credentials are resolved as on /atp and the call goes through ``Router.call``, so a refusal is the
same refusal, audited the same way; here it is answered as a JSON-RPC error (HTTP 200, as JSON-RPC
over HTTP answers errors), its ATP code the ErrorInfo's ``reason``. With authentication on, cards are
shown only to a caller that may call what they describe (the catalog lists only that).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from agent_reach import logs, peer_json
from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame
from agent_reach.headers import REQUEST_ID_HEADER
from agent_reach.sse import EventWriter, on_disconnect
from aiohttp import web

from router.a2a.card import capability_card, catalog_card, schemas_of, skill_of
from router.a2a.tasks import COMPLETED, REJECTED, WORKING, TaskBook, TaskEntry
from router.a2a.translate import (
    RESULT_ARTIFACT,
    STREAM_ARTIFACT,
    artifact_event,
    cancelled,
    frame_of,
    new_context_id,
    refusal_error,
    rpc_error_body,
    rpc_result,
    send_result,
    settle,
    status_event,
    task_event,
    task_of,
)
from router.a2a.wire import (
    ATP_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    METHODS,
    PARSE_ERROR,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    Dialect,
    Envelope,
    Method,
    RpcError,
    SendParams,
    TaskRef,
)
from router.auth import Authenticator, Caller, Unauthenticated, may_call
from router.call import CallResult
from router.core import Router
from router.streaming import Relay
from router.tracecontext import ParentSpan, parent_of
from weblayer.errors import ApiError, from_decode_error
from weblayer.responses import json_response

log = logging.getLogger("agentreach.router.a2a")

_encoder = msgspec.json.Encoder()
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="agentreach"'}
# The API's own checks (router/api.py), handed in: what /atp refuses, A2A refuses alike.
FrameCheck = Callable[[RequestFrame], "RequestFrame | CallResult"]
Identity = Caller | Unauthenticated | None


def _sse(rpc_id: Any, events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + _encoder.encode(rpc_result(rpc_id, event)) + b"\n\n" for event in events)


def _owner(caller: Identity) -> str | None:
    return caller.client_id if isinstance(caller, Caller) else None


def _params(raw: Any, kind: type[Any]) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        field = from_decode_error(exc, "params").field
        raise RpcError(INVALID_PARAMS, f"Invalid params: {exc}", metadata={"field": field or "params"}) from None


class TaskStream:
    """A streamed task's SSE answer: the task (working) before its first chunk, each chunk an update of the
    artifact ``stream``; a caller gone while writing cancels the call, as on /atp."""

    def __init__(self, writer: EventWriter, entry: TaskEntry, dialect: Dialect, rpc_id: Any):
        self.writer, self.entry, self.dialect, self.rpc_id = writer, entry, dialect, rpc_id
        self.seq = 0

    @property
    def started(self) -> bool:
        return self.writer.started

    def opening(self) -> list[dict[str, Any]]:
        """The task as it began, before any update (the stream tells its end after it)."""
        return [] if self.started else [task_event(msgspec.structs.replace(self.entry, state=WORKING), self.dialect)]

    async def chunks(self, batch: list[msgspec.Raw]) -> None:
        events = self.opening() + [
            artifact_event(self.entry, STREAM_ARTIFACT, data, self.dialect, append=self.seq + n > 0, last=False)
            for n, data in enumerate(batch)]
        try:
            await self.writer.send(_sse(self.rpc_id, events))
        except ConnectionError:
            raise asyncio.CancelledError("the caller left while the task streamed") from None
        self.seq += len(batch)

    async def end(self) -> web.StreamResponse:
        events = self.opening()
        if self.entry.state == COMPLETED and self.entry.result is not None:
            events.append(artifact_event(self.entry, RESULT_ARTIFACT, self.entry.result, self.dialect, append=False,
                                         last=True))
        events.append(status_event(self.entry, self.dialect))
        return await self.writer.end(_sse(self.rpc_id, events))


class A2AEndpoint:
    def __init__(self, router: Router, auth: Authenticator | None, check: FrameCheck):
        self.router = router
        self.auth = auth
        self.check = check
        self.tasks = TaskBook()
        self._background: set[asyncio.Future[Any]] = set()

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("GET", "/.well-known/agent-card.json", self.catalog),
                ("GET", "/a2a/{capability}/.well-known/agent-card.json", self.card),
                ("POST", "/a2a", self.rpc), ("POST", "/a2a/{capability}", self.rpc)]

    # Cards

    def _identity(self, request: web.Request) -> Identity:
        return self.auth.authenticate(request.headers) if self.auth is not None else None

    def _reader(self, request: web.Request) -> Identity:
        """Who asks for a card; with authentication on, nobody without a valid credential."""
        caller = self._identity(request)
        if isinstance(caller, Unauthenticated):
            raise ApiError(401, "unauthenticated", caller.message, "Authorization", headers=CHALLENGE)
        return caller

    def _callable(self, caller: Identity, name: str) -> bool:
        return may_call(caller, self.router.plans.of(name))

    @staticmethod
    def _base_url(request: web.Request) -> str:
        return str(request.url.origin())

    async def card(self, request: web.Request) -> web.Response:
        name = request.match_info["capability"]
        caller = self._reader(request)
        offers = self.router.mirror.offers(name)
        if offers is None or not self._callable(caller, name):
            raise ApiError(404, "unknown_capability", f"No capability {name!r} this caller may call", "capability")
        return json_response(capability_card(name, offers, self._base_url(request), self.auth is not None))

    async def catalog(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        mirror = self.router.mirror
        shown = [(name, offers) for name in mirror.capability_names()
                 if (offers := mirror.offers(name)) is not None and self._callable(caller, name)]
        schemas = {key: value for name, offers in shown for key, value in schemas_of(name, offers).items()}
        return json_response(catalog_card([skill_of(name, offers) for name, offers in shown], self._base_url(request),
                                          self.auth is not None, schemas))

    # JSON-RPC

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        rpc_id: Any = None
        try:
            envelope = await self._envelope(request)
            rpc_id = envelope.id
            method, dialect = METHODS.get(envelope.method, (None, Dialect.V1))
            if method is None:
                raise RpcError(METHOD_NOT_FOUND, f"Method {envelope.method!r} not found; this endpoint takes "
                                                 f"{', '.join(METHODS)}")
            caller = self._identity(request)
            if method in (Method.SEND, Method.STREAM):
                params = _params(envelope.params, SendParams)
                return await self._send(request, rpc_id, params, dialect, caller, method is Method.STREAM)
            if isinstance(caller, Unauthenticated):
                raise RpcError(ATP_ERROR, caller.message, ErrorCode.UNAUTHENTICATED.value)
            ref = _params(envelope.params, TaskRef)
            entry = self.tasks.find(ref.id, _owner(caller))
            if entry is None:
                raise RpcError(TASK_NOT_FOUND, f"No task {ref.id!r} (tasks are kept a while after they end)",
                               metadata={"field": "params.id"})
            if method is Method.CANCEL:
                self._cancel(entry)
            return json_response(rpc_result(rpc_id, task_of(entry, dialect)))
        except RpcError as error:
            headers = CHALLENGE if error.reason == ErrorCode.UNAUTHENTICATED.value else None
            return json_response(rpc_error_body(rpc_id, error), headers=headers)

    async def _envelope(self, request: web.Request) -> Envelope:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RpcError(ATP_ERROR, "Request body exceeds the router's size limit",
                           ErrorCode.PAYLOAD_TOO_LARGE.value) from None
        if peer_json.depth_exceeds(raw, peer_json.MAX_CALLER_DEPTH):
            raise RpcError(INVALID_REQUEST, "JSON nests deeper than the router accepts")
        try:
            envelope = msgspec.json.decode(raw, type=Envelope)
        except msgspec.ValidationError as exc:
            raise RpcError(INVALID_REQUEST, f"Not a JSON-RPC 2.0 request: {exc}") from None
        except msgspec.DecodeError as exc:
            raise RpcError(PARSE_ERROR, f"Parse error: {exc}") from None
        if envelope.jsonrpc != "2.0":
            raise RpcError(INVALID_REQUEST, "jsonrpc must be exactly '2.0'")
        return envelope

    def _cancel(self, entry: TaskEntry) -> None:
        if entry.final or entry.call is None:
            raise RpcError(TASK_NOT_CANCELABLE, f"Task {entry.id!r} has ended ({entry.state})",
                           metadata={"field": "params.id"})
        call = entry.call
        self._end_cancelled(entry, "cancelled by tasks/cancel")
        call.cancel()
        log.info("a2a task cancelled", extra={"request_id": entry.id, "capability": entry.capability})

    def _frame(self, request: web.Request, params: SendParams, caller: Identity) -> tuple[RequestFrame, TaskEntry]:
        capability = request.match_info.get("capability")
        context_id = new_context_id(params)
        checked = self.check(frame_of(params, capability, context_id))
        if isinstance(checked, CallResult):
            assert isinstance(checked.frame, ErrorFrame)
            raise refusal_error(checked.frame)
        entry = TaskEntry(id=checked.request_id, context_id=context_id, capability=checked.capability,
                          owner=_owner(caller))
        return checked, self.tasks.open(entry)

    def _end_cancelled(self, entry: TaskEntry, why: str) -> None:
        if not entry.final:
            cancelled(entry, why)
            self.tasks.finish(entry)

    async def _settle(self, entry: TaskEntry, call: asyncio.Future[CallResult]) -> CallResult | None:
        """The call's outcome, recorded in the task; None when it was cancelled (tasks/cancel, the caller gone)."""
        try:
            await asyncio.wait((call,))  # a cancelled call does not raise here; this handler's cancellation does
        except asyncio.CancelledError:
            call.cancel()
            self._end_cancelled(entry, "the router stopped")  # never left working for ever
            raise
        if call.cancelled():
            self._end_cancelled(entry, "the caller left")
            return None
        if entry.final:
            return None  # cancelled as it ended: the task stays as tasks/cancel answered it
        result = call.result()
        settle(entry, result.frame, result.route)
        self.tasks.finish(entry)
        return result

    @staticmethod
    def _parent(request: web.Request) -> ParentSpan | None:
        return parent_of(request.headers)

    async def _send(self, request: web.Request, rpc_id: Any, params: SendParams, dialect: Dialect, caller: Identity,
                    stream: bool) -> web.StreamResponse:
        frame, entry = self._frame(request, params, caller)
        with logs.bind(request_id=frame.request_id, capability=frame.capability):
            if stream:
                return await self._stream(request, rpc_id, frame, entry, dialect, caller)
            call = asyncio.ensure_future(self.router.call(frame, caller, self._parent(request)))
            entry.call = call
            if params.return_immediately and not isinstance(caller, Unauthenticated):
                waiting = asyncio.ensure_future(self._settle(entry, call))
                self._background.add(waiting)
                waiting.add_done_callback(self._background.discard)
                return json_response(rpc_result(rpc_id, send_result(entry, dialect)))
            with on_disconnect(request, call.cancel):
                result = await self._settle(entry, call)
        if result is not None and entry.state == REJECTED:
            assert isinstance(result.frame, ErrorFrame)
            raise refusal_error(result.frame)
        return json_response(rpc_result(rpc_id, send_result(entry, dialect)))

    async def _stream(self, request: web.Request, rpc_id: Any, frame: RequestFrame, entry: TaskEntry,
                      dialect: Dialect, caller: Identity) -> web.StreamResponse:
        """Chunks as artifact updates while the agent produces them, then the result and the final status.
        A refusal before anything was streamed is a JSON-RPC error answer, as the a2a-sdk's server does."""
        frame.stream = True
        writer = EventWriter(request, {REQUEST_ID_HEADER: frame.request_id})
        sink = TaskStream(writer, entry, dialect, rpc_id)
        call = asyncio.ensure_future(self.router.call(frame, caller, self._parent(request), Relay(sink)))
        entry.call = call
        with on_disconnect(request, call.cancel):
            result = await self._settle(entry, call)
        if result is None and (request.transport is None or request.transport.is_closing()):
            log.info("caller left a streamed a2a task", extra={"chunks": sink.seq})
            return writer.response or web.Response()
        if result is not None and entry.state == REJECTED and not sink.started:
            assert isinstance(result.frame, ErrorFrame)
            raise refusal_error(result.frame)
        return await sink.end()
