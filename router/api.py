"""The router's HTTP API: POST /atp (a frame, or JSON-RPC 2.0), reach, alerts, metrics, completions,
and with authentication on, the OAuth2 token endpoint, its JWKS and key rotation."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from agent_reach import logs
from agent_reach.atp import (MAX_CAPABILITY_CHARS, MAX_REQUEST_ID_CHARS, ErrorCode, ErrorFrame, RequestFrame,
                             RouteFacts, error_frame, valid_capability, valid_request_id)
from agent_reach.connections import unreadable_body
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from weblayer.errors import from_decode_error

from router import jsonrpc
from router.audit import AuditLog
from router.audit_query import FilterError, parse_filters
from router.auth import Authenticator, Caller, Unauthenticated
from router.core import CallResult, Router
from router.forward import MAX_CONTEXT_BYTES
from router.metrics import RouterCollector
from router.oauth import OAuthRefusal
from router.reach import health_rate
from router.tracecontext import ParentSpan, parent_span

log = logging.getLogger("agentreach.router.api")

DEFAULT_MAX_BODY = 16 * 1024 * 1024
# Embedding tokenises in Python: a bounded intent keeps one caller from holding the model's thread.
MAX_INTENT_CHARS = 1024
MAX_TRACES_LISTED = 1000
# Deeper JSON than any real frame needs is refused before decoding: recursion is the decoder's cost.
MAX_JSON_DEPTH = 32
# A request carrying this header (any value) gets the routing facts as X-Reach-* headers too.
ROUTE_HEADERS = "X-Reach-Route-Headers"
# All header lines together: past it, a JSON 431 before anything else is looked at.
MAX_HEADER_BYTES = 8192
# aiohttp's own per-line limit, the backstop: past it aiohttp answers a plain-text 400 by itself.
MAX_HEADER_LINE = 32768
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_frame_decoder = msgspec.json.Decoder(RequestFrame)


class Completion(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    request_id: str
    agent_id: str = ""
    finished_ms: float = 0.0


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json",
                        headers=headers)


def audit_handler(audit: AuditLog) -> Handler:
    """GET /audit. It flushes first, so a call answered a moment ago is already there: an operator
    chasing an incident must not miss the last half second (admin-only, so nobody else can force
    the extra write, at most one batch)."""
    async def handler(request: web.Request) -> web.Response:
        try:
            filters = parse_filters(request.query)
        except FilterError as exc:
            return json_response({"error": "invalid_field", "message": exc.message, "field": exc.field}, 400)
        await audit.flush()
        return json_response({"entries": await audit.query(filters)})
    return handler


def route_headers(request_id: str, route: RouteFacts) -> dict[str, str]:
    """The routing facts again as X-Reach-* headers, for callers that only read headers."""
    headers = {"X-Request-Id": request_id, "X-Reach-Attempts": str(route.attempts),
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


def json_depth(raw: bytes) -> int:
    """How deeply a JSON text nests arrays and objects, brackets inside strings not counted."""
    depth = deepest = 0
    for bracket in _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if bracket in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def too_deep(raw: bytes) -> bool:
    """Cheap for ordinary bodies: fewer opening brackets than the limit cannot nest past it."""
    return raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and json_depth(raw) > MAX_JSON_DEPTH


def to_frame(body: Any) -> RequestFrame | CallResult:
    """A request frame from a decoded body, or the INVALID_FRAME answer saying what is wrong."""
    try:
        frame = msgspec.convert(body, RequestFrame)
    except msgspec.ValidationError as exc:
        request_id = body.get("request_id") if isinstance(body, dict) else None
        # Echoed in X-Request-Id: only an id that is itself valid, never the bytes that were refused.
        request_id = request_id if valid_request_id(request_id) else RequestFrame().request_id
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
    if frame.timeout_hint is not None and frame.timeout_hint <= 0:
        return invalid_frame(frame.request_id, "timeout_hint must be a positive number of milliseconds",
                             "timeout_hint")
    if frame.context and len(context := _encoder.encode(frame.context)) > MAX_CONTEXT_BYTES:
        return invalid_frame(frame.request_id, f"context is {len(context)} bytes as JSON; the mesh carries at most "
                                               f"{MAX_CONTEXT_BYTES} (it travels in a header to rest agents): send "
                                               "data in the payload", "context")
    return frame


def header_bytes(request: web.Request) -> int:
    return sum(len(name) + len(value) for name, value in request.raw_headers)


def guarded(handler: Handler) -> Handler:
    """Headers over the limit are refused, and an unexpected failure becomes a JSON 500. Per handler
    rather than as middleware: an aiohttp middleware costs every call on /atp ~10 µs (measured)."""
    async def run(request: web.Request) -> web.StreamResponse:
        size = header_bytes(request)
        if size > MAX_HEADER_BYTES:
            return json_response({"error": "headers_too_large", "field": "headers",
                                  "message": f"Request headers are {size} bytes; the router accepts at most "
                                             f"{MAX_HEADER_BYTES}"}, 431)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except web.RequestPayloadError as exc:
            status, body = unreadable_body(exc)
            return json_response(body, status)
        except Exception:
            log.exception("unhandled error", extra={"path": request.path})
            return json_response({"error": "internal_error", "field": None,
                                  "message": "The router failed to handle this request"}, 500)
    return run


def answer_headers(result: CallResult, route_facts: bool) -> dict[str, str]:
    """X-Request-Id always; the routing facts as X-Reach-* headers when the caller asked for them
    (``X-Reach-Route-Headers``): the body's `route` object carries the same facts, and the headers
    cost every call ~10 µs (measured), most of it in aiohttp's header handling."""
    headers = route_headers(result.frame.request_id, result.route) if route_facts else \
        {"X-Request-Id": result.frame.request_id}
    if result.retry_after is not None:
        headers["Retry-After"] = str(result.retry_after)
    if isinstance(result.frame, ErrorFrame) and result.frame.error_code == ErrorCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="agentreach"'
    return headers


def create_app(router: Router, *, max_body: int = DEFAULT_MAX_BODY,
               auth: Authenticator | None = None) -> web.Application:
    """``auth`` None serves everyone (development); otherwise every call and operator endpoint is checked."""
    prometheus = CollectorRegistry(auto_describe=False)
    prometheus.register(RouterCollector(router))

    async def run(frame: RequestFrame | CallResult, caller: Caller | Unauthenticated | None,
                  parent: ParentSpan | None) -> CallResult:
        if isinstance(frame, CallResult):
            return frame
        with logs.bind(request_id=frame.request_id, capability=frame.capability):
            return await router.call(frame, caller, parent)

    async def atp(request: web.Request) -> web.StreamResponse:
        caller = auth.authenticate(request.headers) if auth is not None else None
        # The caller's W3C trace, continued by every call in the body (an invalid one is ignored).
        headers = request.headers
        parent = parent_span(headers["traceparent"], ",".join(headers.getall("tracestate", ()))) \
            if "traceparent" in headers else None
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            frame = error_frame(RequestFrame().request_id, ErrorCode.PAYLOAD_TOO_LARGE,
                                f"Request body exceeds the router's limit of {max_body} bytes")
            return json_response(frame, 413, {"X-Request-Id": frame.request_id})
        if too_deep(raw):
            result = invalid_frame(RequestFrame().request_id,
                                   f"JSON nesting exceeds the router's limit of {MAX_JSON_DEPTH} levels")
            return json_response(result.frame, 400, {"X-Request-Id": result.frame.request_id})
        if b'"jsonrpc"' not in raw:
            # The common case, decoded and validated in one pass; anything odd takes the general path.
            try:
                frame = checked(_frame_decoder.decode(raw))
            except msgspec.MsgspecError:
                pass
            else:
                return await answer_frame(frame, caller, ROUTE_HEADERS in request.headers, parent)
        try:
            body = _decoder.decode(raw)
        except msgspec.DecodeError as exc:
            if raw.lstrip()[:1] in (b"[", b"{") and b'"jsonrpc"' in raw:
                return json_response(jsonrpc.error_answer(None, jsonrpc.PARSE_ERROR, f"Parse error: {exc}"))
            result = invalid_frame(RequestFrame().request_id, f"Body is not valid JSON: {exc}")
            return json_response(result.frame, 400, {"X-Request-Id": result.frame.request_id})
        if jsonrpc.is_envelope(body):
            return await rpc(body, caller, parent)
        return await answer_frame(to_frame(body), caller, ROUTE_HEADERS in request.headers, parent)

    async def answer_frame(frame: RequestFrame | CallResult, caller: Caller | Unauthenticated | None,
                           route_facts: bool, parent: ParentSpan | None) -> web.Response:
        if isinstance(frame, CallResult):
            result = frame
        else:  # inline, not through run(): one coroutine frame less for every await below
            with logs.bind(request_id=frame.request_id, capability=frame.capability):
                result = await router.call(frame, caller, parent)
        return json_response(result.frame, result.http_status, answer_headers(result, route_facts))

    async def rpc_one(item: Any, caller: Caller | Unauthenticated | None,
                      parent: ParentSpan | None) -> dict[str, Any] | None:
        try:
            envelope = jsonrpc.parse_envelope(item)
        except jsonrpc.RpcError as exc:
            return jsonrpc.error_answer(exc.request_id, exc.code, exc.message)
        frame = to_frame(envelope.params)
        if isinstance(frame, CallResult):
            error = frame.frame
            assert isinstance(error, ErrorFrame)
            answer = jsonrpc.error_answer(envelope.id, jsonrpc.INVALID_PARAMS, error.error_message,
                                          msgspec.to_builtins(error))
        else:
            answer = jsonrpc.answer(envelope.id, (await run(frame, caller, parent)).frame)
        return answer if envelope.has_id else None

    async def rpc(body: Any, caller: Caller | Unauthenticated | None, parent: ParentSpan | None) -> web.Response:
        if isinstance(body, list):
            if not body:
                return json_response(jsonrpc.error_answer(None, jsonrpc.INVALID_REQUEST, "Empty batch"))
            answers = [a for a in await asyncio.gather(*(rpc_one(item, caller, parent) for item in body))
                       if a is not None]
            return json_response(answers) if answers else web.Response(status=204)
        answer = await rpc_one(body, caller, parent)
        return json_response(answer) if answer is not None else web.Response(status=204)

    async def reach(request: web.Request) -> web.Response:
        capability = request.query.get("capability")
        now = time.time()
        states = [state.state for state in router.mirror.states.values()]
        return json_response({
            "period_seconds": router.ledger.period_seconds,
            "periods": router.ledger.periods(capability, now=now),
            "instance_health_rate": health_rate(states.count("healthy"), len(router.mirror.instances)),
            "route_decisions": dict(router.decisions),
            "semantic": router.semantic.stats() if router.semantic is not None else None,
        })

    async def alerts(request: web.Request) -> web.Response:
        return json_response({"alerts": router.ledger.alerts(time.time()), "config": router.ledger.alert_config})

    async def completions(request: web.Request) -> web.Response:
        try:
            note = msgspec.json.decode(await request.read(), type=Completion)
        except msgspec.MsgspecError as exc:
            return json_response({"error": "invalid_completion", "message": str(exc), "field": None}, 400)
        with logs.bind(request_id=note.request_id):
            known = router.late_completion(note.request_id, note.agent_id, note.finished_ms)
        return json_response({"request_id": note.request_id, "known": known})

    async def traces(request: web.Request) -> web.Response:
        raw = request.query.get("limit", "50")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TRACES_LISTED:
            return json_response({"error": "invalid_field", "field": "limit",
                                  "message": f"limit must be a whole number from 1 to {MAX_TRACES_LISTED}"}, 400)
        return json_response({"traces": router.traces.recent(int(raw), request.query.get("capability"))})

    async def trace(request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        call, tree = router.traces.get(request_id), router.traces.tree(request_id)
        if call is None:
            return json_response({"error": "trace_not_found", "field": "request_id",
                                  "message": f"No recent call {request_id!r} (the router keeps the last "
                                             f"{router.traces.max_calls})"}, 404)
        return json_response({"call": call, "tree": tree})

    async def healthz(request: web.Request) -> web.Response:
        mirror = router.mirror
        return json_response({"status": "ok", "registry_synced": mirror.synced, "revision": mirror.revision,
                              "capabilities": len(mirror.capability_names())})

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(prometheus))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def token(request: web.Request) -> web.Response:
        """POST /oauth/token (RFC 6749 §4.4): client credentials in, a signed access token out."""
        assert auth is not None
        if request.content_type != "application/x-www-form-urlencoded":
            answer: Any = OAuthRefusal(error="invalid_request", field="Content-Type",
                                       error_description="Send the token request as application/x-www-form-urlencoded")
        else:
            answer = auth.issuer.grant(await request.post(), request.headers.get("Authorization"), router.mirror.auth)
        headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        if isinstance(answer, OAuthRefusal):
            if answer.basic:
                headers["WWW-Authenticate"] = 'Basic realm="agentreach"'
            log.warning("token refused", extra={"error": answer.error, "reason": answer.error_description})
            return json_response(answer.body(), answer.status, headers)
        return json_response(answer, 200, headers)

    async def jwks(request: web.Request) -> web.Response:
        assert auth is not None
        return json_response(auth.issuer.jwks())

    async def rotate_keys(request: web.Request) -> web.Response:
        assert auth is not None
        key = auth.issuer.keys.rotate()
        return json_response({"kid": key.kid, "jwks": auth.issuer.jwks()})

    def admin(handler: Handler) -> Handler:
        """Operator endpoints: the admin key, as X-API-Key or Authorization: Bearer, when auth is on."""
        if auth is None:
            return handler

        async def checked_admin(request: web.Request) -> web.StreamResponse:
            assert auth is not None
            refusal = auth.admin_refusal(request.headers)
            if refusal is not None:
                return json_response({"error": refusal.error, "field": "Authorization", "message": refusal.message},
                                     refusal.status)
            return await handler(request)
        return checked_admin

    async def unrouted(request: web.Request) -> web.Response:
        """A path or method the router does not serve: JSON like every other error, 405 with Allow."""
        allowed: set[str] = set()
        for resource in app.router.resources():
            if resource is not catch_all:
                allowed |= (await resource.resolve(request))[1]
        if allowed:
            return json_response({"error": "method_not_allowed", "field": None,
                                  "message": f"{request.method} is not allowed here; use {', '.join(sorted(allowed))}"},
                                 405, {"Allow": ", ".join(sorted(allowed))})
        return json_response({"error": "not_found", "field": None, "message": f"No such endpoint: {request.path}"},
                             404)

    app = web.Application(client_max_size=max_body)
    # /completions stays open: an agent reports a late completion there, and all it does is log a line.
    routes = [("POST", "/atp", atp), ("POST", "/completions", completions), ("GET", "/reach", admin(reach)),
              ("GET", "/alerts", admin(alerts)), ("GET", "/traces", admin(traces)),
              ("GET", "/traces/{request_id}", admin(trace)), ("GET", "/healthz", healthz), ("GET", "/metrics", metrics)]
    if router.audit is not None:
        routes.append(("GET", "/audit", admin(audit_handler(router.audit))))
    if auth is not None:
        routes += [("POST", "/oauth/token", token), ("GET", "/.well-known/jwks.json", jwks),
                   ("POST", "/oauth/keys/rotate", admin(rotate_keys))]
    for method, path, handler in routes:
        app.router.add_route(method, path, guarded(handler))
    catch_all = app.router.add_route("*", "/{path:.*}", unrouted).resource
    return app
