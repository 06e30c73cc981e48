"""The router's HTTP API: the hot path, POST /atp (a frame, or JSON-RPC 2.0), the open endpoints beside it
(completions, healthz, metrics) and the route table of every endpoint. The admin-only inspection endpoints
are router/inspection.py's, the OAuth2 ones router/oauth_api.py's.

POST /atp is an `Atp` object: the hot path reads the router from an attribute. Every other handler is a
function reading the router's parts from the app (typed AppKeys, router/app_keys.py). The route tables sit
above `create_app`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import msgspec
from agent_reach import logs, peer_json
from agent_reach.admission import Gate
from agent_reach.atp import (
    BUDGET_LABELS,
    MAX_CAPABILITY_CHARS,
    MAX_REQUEST_ID_CHARS,
    ErrorCode,
    ErrorFrame,
    RequestFrame,
    RouteFacts,
    call_bound_problem,
    error_frame,
    valid_budget,
    valid_capability,
    valid_request_id,
    valid_routing_hint,
    valid_token_budget,
)
from agent_reach.headers import REQUEST_ID_HEADER, ROUTE_HEADERS, TRACEPARENT_HEADER, TRACESTATE_HEADER
from agent_reach.sse import ERROR, RESPONSE, EventWriter, on_disconnect, wants_stream
from agent_reach.usage import MAX_TOKENS
from agent_reach.versions import check_constraint
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from router import jsonrpc
from router.a2a.endpoint import A2AEndpoint
from router.app_keys import AUDIT_KEY, AUTH_KEY, METRICS_KEY, ROUTER_KEY
from router.auth import Authenticator, Caller, Unauthenticated
from router.call import CallResult
from router.core import Router
from router.inspection import alerts, audit_entries, reach, rule_stats, scores, trace, traces, usage
from router.mcp.endpoint import McpEndpoint
from router.mcp.metrics import McpCollector
from router.metrics import RouterCollector
from router.oauth_api import admin_refusal, jwks, rotate_keys, token
from router.openapi import OPENAPI_ROUTE
from router.streaming import CallerStream, Relay
from router.tracecontext import ParentSpan, parent_span
from router.transports.rest import MAX_CONTEXT_BYTES
from weblayer.connection_metrics import ConnectionCollector
from weblayer.errors import ApiError, from_decode_error
from weblayer.guard import admin_only
from weblayer.middleware import failure_response
from weblayer.responses import error_response, json_response

log = logging.getLogger("agentreach.router.api")

DEFAULT_MAX_BODY = 16 * 1024 * 1024
# Embedding tokenises in Python: a bounded intent keeps one caller from holding the model's thread.
MAX_INTENT_CHARS = 1024
# All header lines together: past it, a JSON 431 before anything else is looked at.
MAX_HEADER_BYTES = 8192
# aiohttp's own per-line limit, the backstop: past it aiohttp answers a plain-text 400 by itself.
MAX_HEADER_LINE = 32768
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_frame_decoder = msgspec.json.Decoder(RequestFrame)



class Completion(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    request_id: str
    agent_id: str = ""
    finished_ms: float = 0.0


def route_headers(request_id: str, route: RouteFacts) -> dict[str, str]:
    """The routing facts again as X-Reach-* headers, for callers that only read headers."""
    headers = {REQUEST_ID_HEADER: request_id, "X-Reach-Attempts": str(route.attempts),
               "X-Reach-Degraded": "true" if route.degraded else "false"}
    for name, value in (("Instance", route.instance), ("Policy", route.policy),
                        ("Timeout-Sla-Ms", route.timeout_sla_ms), ("Overhead-Ms", route.overhead_ms),
                        ("Capability", route.capability), ("Reason", route.reason),
                        ("Match-Score", route.match_score)):
        if value is not None:
            headers[f"X-Reach-{name}"] = str(value)
    return headers


def invalid_frame(request_id: str, message: str, field: str | None = None) -> CallResult:
    route = RouteFacts()
    frame = error_frame(request_id, ErrorCode.INVALID_FRAME, message, field)
    return CallResult(frame=frame, route=route)


def to_frame(body: Any) -> RequestFrame | CallResult:
    """A request frame from a decoded body, or the INVALID_FRAME answer saying what is wrong."""
    try:
        frame = msgspec.convert(body, RequestFrame)
    except msgspec.ValidationError as exc:
        sent = body.get("request_id") if isinstance(body, dict) else None
        # Echoed in X-Request-Id: only an id that is itself valid, never the bytes that were refused.
        request_id = sent if isinstance(sent, str) and valid_request_id(sent) else RequestFrame().request_id
        return invalid_frame(request_id, f"Not an ATP request frame: {exc}", from_decode_error(exc).field)
    return checked(frame)


def checked(frame: RequestFrame) -> RequestFrame | CallResult:
    """What a frame's schema cannot say: it must name a capability or an intent, within limits."""
    if not valid_request_id(frame.request_id):
        # Answered under a new id: the refused one must not reach X-Request-Id.
        return invalid_frame(RequestFrame().request_id, f"request_id must be 1 to {MAX_REQUEST_ID_CHARS} visible "
                                                        "ASCII characters (no spaces or control characters)",
                             "request_id")
    if not frame.capability and not frame.intent:
        return invalid_frame(frame.request_id, "capability is required (or, with semantic matching on, intent)",
                             "capability")
    if frame.capability and not valid_capability(frame.capability):
        return invalid_frame(frame.request_id, f"capability must be a capability name: up to {MAX_CAPABILITY_CHARS} "
                                               "letters, digits and . _ : - (starting with a letter or digit)",
                             "capability")
    if frame.intent is not None and not 0 < len(frame.intent) <= MAX_INTENT_CHARS:
        return invalid_frame(frame.request_id, f"intent must be 1 to {MAX_INTENT_CHARS} characters", "intent")
    if frame.confirm_intent and not (frame.intent and frame.capability):
        return invalid_frame(frame.request_id, "confirm_intent needs both intent and the capability it meant",
                             "confirm_intent")
    if frame.timeout_hint is not None and frame.timeout_hint <= 0:
        return invalid_frame(frame.request_id, "timeout_hint must be a positive number of milliseconds",
                             "timeout_hint")
    if frame.version is not None and (problem := check_constraint(frame.version)) is not None:
        return invalid_frame(frame.request_id, f"version: {problem}", "version")
    if not valid_routing_hint(frame.context):
        return invalid_frame(frame.request_id, "context.routing_hint must be an object: the metadata labels an "
                                               "instance must have, with their values", "context.routing_hint")
    if not valid_budget(frame.context):
        return invalid_frame(frame.request_id, f"context.budget must be one of {', '.join(BUDGET_LABELS)}",
                             "context.budget")
    if not valid_token_budget(frame.context):
        return invalid_frame(frame.request_id, f"context.token_budget must be a whole number of tokens (at most "
                                               f"{MAX_TOKENS} either side of 0)", "context.token_budget")
    if (bound := call_bound_problem(frame.context)) is not None:
        return invalid_frame(frame.request_id, f"{bound} must be what the call may use at most: a whole number of "
                                               f"tokens from 1 (max_tokens), a cost above 0 (max_cost)", bound)
    if frame.context and len(context := _encoder.encode(frame.context)) > MAX_CONTEXT_BYTES:
        return invalid_frame(frame.request_id, f"context is {len(context)} bytes as JSON; the mesh carries at most "
                                               f"{MAX_CONTEXT_BYTES} (it travels in a header to rest agents): send "
                                               "data in the payload", "context")
    return frame


def header_bytes(request: web.Request) -> int:
    return sum(len(name) + len(value) for name, value in request.raw_headers)


def guarded(handler: Handler) -> Handler:
    """Headers over the limit are refused, and a failure becomes a JSON answer. Per handler rather
    than as middleware: an aiohttp middleware costs every call on /atp ~10 µs (measured)."""
    async def run(request: web.Request) -> web.StreamResponse:
        size = header_bytes(request)
        if size > MAX_HEADER_BYTES:
            return error_response(ApiError(431, "headers_too_large", f"Request headers are {size} bytes; the router "
                                                                     f"accepts at most {MAX_HEADER_BYTES}", "headers"))
        try:
            return await handler(request)
        except ApiError as error:
            return error_response(error)
        except web.HTTPException:
            raise
        except Exception as exc:
            return failure_response(exc, request, "router", log)
    return run


def answer_headers(result: CallResult, route_facts: bool) -> dict[str, str]:
    """X-Request-Id always; the routing facts as X-Reach-* headers when the caller asked for them
    (``X-Reach-Route-Headers``): the body's `route` object carries the same facts, and the headers
    cost every call ~10 µs (measured), most of it in aiohttp's header handling."""
    headers = route_headers(result.frame.request_id, result.route) if route_facts else \
        {REQUEST_ID_HEADER: result.frame.request_id}
    if result.retry_after is not None:
        headers["Retry-After"] = str(result.retry_after)
    if isinstance(result.frame, ErrorFrame) and result.frame.error_code == ErrorCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="agentreach"'
    return headers


def refused_frame(result: CallResult, status: int) -> web.Response:
    """An error frame for a body refused before it became a frame, under the id it was answered with."""
    return json_response(result.frame, status, {REQUEST_ID_HEADER: result.frame.request_id})


# Who a call comes from: a resolved caller, a refused credential, or nobody asked (auth off).
Identity = Caller | Unauthenticated | None


class Atp:
    """POST /atp: a request frame, or JSON-RPC 2.0 envelopes carrying frames (a batch's calls run at once)."""

    def __init__(self, router: Router, auth: Authenticator | None, max_body: int):
        self.router = router
        self.auth = auth
        self.max_body = max_body

    async def handle(self, request: web.Request) -> web.StreamResponse:
        caller = self.auth.authenticate(request.headers) if self.auth is not None else None
        # The caller's W3C trace, continued by every call in the body (an invalid one is ignored).
        headers = request.headers
        parent = parent_span(headers[TRACEPARENT_HEADER], ",".join(headers.getall(TRACESTATE_HEADER, ()))) \
            if TRACEPARENT_HEADER in headers else None
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            too_large = error_frame(RequestFrame().request_id, ErrorCode.PAYLOAD_TOO_LARGE,
                                    f"Request body exceeds the router's limit of {self.max_body} bytes")
            return json_response(too_large, 413, {REQUEST_ID_HEADER: too_large.request_id})
        # Deeper JSON than any real frame needs is refused before decoding: recursion is the decoder's cost.
        if peer_json.depth_exceeds(raw, peer_json.MAX_CALLER_DEPTH):
            limit = peer_json.MAX_CALLER_DEPTH
            return refused_frame(invalid_frame(RequestFrame().request_id,
                                               f"JSON nesting exceeds the router's limit of {limit} levels"), 400)
        if b'"jsonrpc"' not in raw:
            # The common case, decoded and validated in one pass; anything odd takes the general path.
            try:
                frame = checked(_frame_decoder.decode(raw))
            except msgspec.MsgspecError:
                pass
            else:
                return await self.answer_frame(frame, caller, ROUTE_HEADERS in headers, parent, request)
        try:
            body = _decoder.decode(raw)
        except msgspec.DecodeError as exc:
            if raw.lstrip()[:1] in (b"[", b"{") and b'"jsonrpc"' in raw:
                return json_response(jsonrpc.error_answer(None, jsonrpc.PARSE_ERROR, f"Parse error: {exc}"))
            return refused_frame(invalid_frame(RequestFrame().request_id, f"Body is not valid JSON: {exc}"), 400)
        if jsonrpc.is_envelope(body):
            return await self.rpc(body, caller, parent)
        return await self.answer_frame(to_frame(body), caller, ROUTE_HEADERS in headers, parent, request)

    async def answer_frame(self, frame: RequestFrame | CallResult, caller: Identity, route_facts: bool,
                           parent: ParentSpan | None, request: web.Request | None = None) -> web.StreamResponse:
        if isinstance(frame, CallResult):
            result = frame
        elif request is not None and (frame.stream or wants_stream(request.headers.get("Accept", ""))):
            return await self.stream(request, frame, caller, route_facts, parent)
        else:  # inline, not through call(): one coroutine frame less for every await below
            with logs.bind(request_id=frame.request_id, capability=frame.capability):
                result = await self.router.call(frame, caller, parent)
        return json_response(result.frame, result.http_status, answer_headers(result, route_facts))

    async def stream(self, request: web.Request, frame: RequestFrame, caller: Identity, route_facts: bool,
                     parent: ParentSpan | None) -> web.StreamResponse:
        """A streamed answer: each chunk as the agent sends it, then the final frame's event. Its status
        is the final frame's when no chunk came before it. The caller leaving cancels the call at once,
        which closes the agent's connection (router/forward.py): no work goes on for nobody."""
        frame.stream = True
        writer = EventWriter(request, {REQUEST_ID_HEADER: frame.request_id})
        sink = CallerStream(writer, frame.request_id)
        with logs.bind(request_id=frame.request_id, capability=frame.capability):
            call = asyncio.ensure_future(self.router.call(frame, caller, parent, Relay(sink)))
            with on_disconnect(request, call.cancel):
                try:
                    result = await call
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    log.info("caller left a streamed call", extra={"chunks": sink.seq})
                    return writer.response or web.Response()  # nobody reads it: the connection is gone
        writer.headers.update(answer_headers(result, route_facts))
        await sink.end(ERROR if isinstance(result.frame, ErrorFrame) else RESPONSE, _encoder.encode(result.frame),
                       result.http_status)
        assert writer.response is not None
        return writer.response

    async def call(self, frame: RequestFrame | CallResult, caller: Identity, parent: ParentSpan | None) -> CallResult:
        if isinstance(frame, CallResult):
            return frame
        with logs.bind(request_id=frame.request_id, capability=frame.capability):
            return await self.router.call(frame, caller, parent)

    async def rpc_one(self, item: Any, caller: Identity, parent: ParentSpan | None) -> dict[str, Any] | None:
        try:
            rpc = jsonrpc.parse_envelope(item)
        except jsonrpc.RpcError as exc:
            return jsonrpc.error_answer(exc.request_id, exc.code, exc.message)
        frame = to_frame(rpc.params)
        if isinstance(frame, CallResult):
            error = frame.frame
            assert isinstance(error, ErrorFrame)
            answer = jsonrpc.error_answer(rpc.id, jsonrpc.INVALID_PARAMS, error.error_message,
                                          msgspec.to_builtins(error))
        else:
            answer = jsonrpc.answer(rpc.id, (await self.call(frame, caller, parent)).frame)
        return answer if rpc.has_id else None

    async def rpc(self, body: Any, caller: Identity, parent: ParentSpan | None) -> web.Response:
        if isinstance(body, list):
            if not body:
                return json_response(jsonrpc.error_answer(None, jsonrpc.INVALID_REQUEST, "Empty batch"))
            answers = [a for a in await asyncio.gather(*(self.rpc_one(item, caller, parent) for item in body))
                       if a is not None]
            return json_response(answers) if answers else web.Response(status=204)
        answer = await self.rpc_one(body, caller, parent)
        return json_response(answer) if answer is not None else web.Response(status=204)


async def completions(request: web.Request) -> web.Response:
    """POST /completions: an agent's late completion (open: all it does is log a line)."""
    try:
        note = peer_json.decode(await request.read(), type=Completion)
    except msgspec.MsgspecError as exc:
        raise ApiError(400, "invalid_completion", str(exc)) from None
    with logs.bind(request_id=note.request_id):
        known = request.app[ROUTER_KEY].failover.late_completion(note.request_id, note.agent_id, note.finished_ms)
    return json_response({"request_id": note.request_id, "known": known})


async def healthz(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    mirror = router.mirror
    health: dict[str, Any] = {"status": "ok", "registry_synced": mirror.synced, "revision": mirror.revision,
                              "capabilities": len(mirror.capability_names()), "router_id": mirror.router_id,
                              "routers": len(mirror.routers), "limit_share": mirror.limit_share}
    if router.semantic is not None:
        # The embedding models intents are matched with, in the order they are asked.
        health["embedding_models"] = [{"model": stage.name, "dimensions": stage.embedder.dimensions,
                                       "rule": stage.source, "off_languages": sorted(stage.off)}
                                      for stage in router.semantic.stages]
    return json_response(health)


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest(request.app[METRICS_KEY]))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def unrouted(request: web.Request) -> web.Response:
    """A path or method the router does not serve: JSON like every other error, 405 with Allow."""
    catch_all = request.match_info.route.resource
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not catch_all:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        methods = ", ".join(sorted(allowed))
        message = f"{request.method} is not allowed here; use {methods}"
        return error_response(ApiError(405, "method_not_allowed", message, headers={"Allow": methods}))
    return error_response(ApiError(404, "not_found", f"No such endpoint: {request.path}"))


OPEN: list[tuple[str, str, Handler]] = [
    ("POST", "/completions", completions), ("GET", "/healthz", healthz), ("GET", "/metrics", metrics)]
ADMIN_ONLY: list[tuple[str, str, Handler]] = [
    ("GET", "/reach", reach), ("GET", "/alerts", alerts), ("GET", "/rules/stats", rule_stats),
    ("GET", "/usage", usage),
    ("GET", "/scores/{capability}", scores),
    ("GET", "/traces", traces), ("GET", "/traces/{request_id}", trace)]
# With an audit trail kept.
AUDIT: tuple[str, str, Handler] = ("GET", "/audit", audit_entries)
# With authentication on.
OAUTH_OPEN: list[tuple[str, str, Handler]] = [
    ("POST", "/oauth/token", token), ("GET", "/.well-known/jwks.json", jwks)]
OAUTH_ADMIN_ONLY: list[tuple[str, str, Handler]] = [("POST", "/oauth/keys/rotate", rotate_keys)]



def router_metrics(router: Router, connections: Gate | None = None) -> CollectorRegistry:
    prometheus = CollectorRegistry(auto_describe=False)
    prometheus.register(RouterCollector(router))
    if connections is not None:
        prometheus.register(ConnectionCollector("router", connections))
    return prometheus


def create_app(router: Router, *, max_body: int = DEFAULT_MAX_BODY, auth: Authenticator | None = None,
               whole: Mapping[str, Handler] | None = None, connections: Gate | None = None) -> web.Application:
    """``auth`` None serves everyone (development); otherwise every call and operator endpoint is checked.
    ``whole``: one of `--workers N` answers these paths for the whole router (router/worker_views.py);
    ``connections``, the listener's, is shown in /metrics."""
    app = web.Application(client_max_size=max_body)
    app[ROUTER_KEY] = router
    app[METRICS_KEY] = router_metrics(router, connections)
    mcp = McpEndpoint(router, auth, checked)
    app[METRICS_KEY].register(McpCollector(mcp.sessions))
    open_routes = [("POST", "/atp", Atp(router, auth, max_body).handle), *OPEN,
                   *A2AEndpoint(router, auth, checked).routes(), *mcp.routes(), OPENAPI_ROUTE]
    admin_routes = list(ADMIN_ONLY)
    if router.audit is not None:
        app[AUDIT_KEY] = router.audit
        admin_routes.append(AUDIT)
    if whole is not None:
        open_routes = [(method, path, whole.get(path, handler)) for method, path, handler in open_routes]
        admin_routes = [(method, path, whole.get(path, handler)) for method, path, handler in admin_routes]
    if auth is not None:
        app[AUTH_KEY] = auth
        open_routes += OAUTH_OPEN
        admin_routes += OAUTH_ADMIN_ONLY
        admin_routes = [(method, path, admin_only(handler, admin_refusal)) for method, path, handler in admin_routes]
    for method, path, handler in open_routes + admin_routes:
        app.router.add_route(method, path, guarded(handler))
    app.router.add_route("*", "/{path:.*}", unrouted)
    return app
