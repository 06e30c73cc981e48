"""The router's MCP face: Streamable HTTP at ``/mcp``, and the protected-resource metadata beside it.

``POST /mcp`` takes one JSON-RPC message: ``initialize`` (a session, its id in ``Mcp-Session-Id``),
``ping``, ``tools/list`` (each capability the caller may call, router/mcp/tools.py) and ``tools/call``
(an ATP call through ``Router.call`` with the caller's credentials, so grants, trust, budgets, rate
limits, audit and reach are /atp's). A notification or a response is accepted with 202. A call given a
``progressToken`` streams: the answer is server-sent events, a ``notifications/progress`` per chunk, then
the result. ``GET /mcp`` with a session opens that session's stream of what the router sends unasked:
``notifications/tools/list_changed`` whenever the tools the caller may call change (a capability comes or
goes, a schema or the caller's grants change). ``DELETE /mcp`` ends a session and closes its stream.

Errors are JSON-RPC errors: a message that is no JSON-RPC request -32700/-32600 (HTTP 400), an unknown
method -32601, bad params, an unknown or forbidden tool, oversized arguments, a schema violation -32602,
any other ATP refusal -32000 with the error frame in ``data``. An agent's business error is a tool result
with ``isError``. Without a valid credential (auth on): HTTP 401 naming the metadata (RFC 9728).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from agent_reach import logs, peer_json
from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame, ResponseFrame
from agent_reach.sse import STREAM_HEADERS, on_disconnect
from aiohttp import web
from yarl import URL

from router.auth import Authenticator, Caller, Unauthenticated, may_call
from router.call import CallResult
from router.core import Router
from router.mcp.sessions import Session, Sessions
from router.mcp.tools import business_failure, is_business_failure, payload_of, success, tool_of
from router.streaming import Relay
from router.tracecontext import parent_of
from weblayer.errors import ApiError
from weblayer.responses import json_response

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
METADATA_PATH = "/.well-known/oauth-protected-resource"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
ATP_ERROR = -32000  # any other ATP refusal, its error frame in `data` (as on /atp's JSON-RPC)
SESSION_NOT_FOUND = -32001
KEEPALIVE_SECONDS = 15.0  # a comment line on an idle stream, so proxies keep it and a gone reader shows
MAX_STREAMS = 1000  # open at once: each is a connection held and a tool list derived at each change
MAX_STREAMS_PER_CLIENT = 32

# What the caller got wrong about the tool or its arguments: the spec's invalid params.
CALLER_CODES = frozenset({ErrorCode.INVALID_FRAME, ErrorCode.INVALID_PAYLOAD, ErrorCode.PAYLOAD_TOO_LARGE,
                          ErrorCode.UNKNOWN_CAPABILITY, ErrorCode.FORBIDDEN, ErrorCode.TRUST_LEVEL_INSUFFICIENT,
                          ErrorCode.ROUTING_HINT_UNSATISFIABLE, ErrorCode.VERSION_UNSATISFIABLE})
SERVER_INFO = {"name": "agentreach", "title": "Agent Reach mesh", "version": "0.1.0"}
INSTRUCTIONS = "Each tool is a capability of the mesh; a call is routed to a live instance of it."

FrameCheck = Callable[[RequestFrame], "RequestFrame | CallResult"]
Identity = Caller | Unauthenticated | None
_encoder = msgspec.json.Encoder()


class McpError(Exception):
    def __init__(self, code: int, message: str, data: Any = None, status: int = 200):
        super().__init__(message)
        self.code, self.message, self.data, self.status = code, message, data, status


def _answer(rpc_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def _error_body(rpc_id: Any, error: McpError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": body}


def _refusal(frame: ErrorFrame) -> McpError:
    code = INVALID_PARAMS if frame.error_code in CALLER_CODES else ATP_ERROR
    message = f"Unknown tool: {frame.error_message}" if frame.error_code is ErrorCode.UNKNOWN_CAPABILITY \
        else frame.error_message
    return McpError(code, message, msgspec.to_builtins(frame))


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + _encoder.encode(message) + b"\n\n"


class Progress:
    """A streamed tool call's answer: each chunk a ``notifications/progress`` event (its JSON the message),
    then the result; a caller gone while writing cancels the call, as on /atp."""

    def __init__(self, request: web.Request, token: str | int):
        self.request, self.token = request, token
        self.response: web.StreamResponse | None = None
        self.seq = 0

    async def _write(self, data: bytes) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers=STREAM_HEADERS)
            await self.response.prepare(self.request)
        await self.response.write(data)

    async def chunks(self, batch: list[msgspec.Raw]) -> None:
        events = b"".join(_event({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
            "progressToken": self.token, "progress": self.seq + n + 1, "message": bytes(data).decode()}})
            for n, data in enumerate(batch))
        try:
            await self._write(events)
        except ConnectionError:
            raise asyncio.CancelledError("the caller left while the tool call streamed") from None
        self.seq += len(batch)

    async def end(self, message: dict[str, Any]) -> web.StreamResponse:
        """The last event, the call's answer; before any chunk, a plain JSON answer."""
        if self.response is None:
            return json_response(message)
        try:
            await self.response.write(_event(message))
            await self.response.write_eof()
        except ConnectionError:
            pass
        return self.response


class McpEndpoint:
    def __init__(self, router: Router, auth: Authenticator | None, check: FrameCheck):
        self.router = router
        self.auth = auth
        self.check = check
        self.sessions = Sessions()
        # The tool lists at view change _listed_at, by the (trust level, grants) that decide them.
        self._listed: dict[tuple[str, tuple[str, ...]] | None, bytes] = {}
        self._listed_at = -1

    def routes(self) -> list[tuple[str, str, Any]]:
        routes = [("POST", "/mcp", self.post), ("GET", "/mcp", self.stream), ("DELETE", "/mcp", self.delete)]
        if self.auth is not None:
            routes += [("GET", METADATA_PATH, self.metadata), ("GET", f"{METADATA_PATH}/mcp", self.metadata)]
        return routes

    # HTTP

    @staticmethod
    def _base_url(request: web.Request) -> str:
        return str(request.url.origin())

    async def metadata(self, request: web.Request) -> web.Response:
        """RFC 9728: where tokens for /mcp come from (the router's own client-credentials endpoint)."""
        base = self._base_url(request)
        return json_response({"resource": f"{base}/mcp", "authorization_servers": [base],
                              "token_endpoint": f"{base}/oauth/token", "bearer_methods_supported": ["header"],
                              "resource_name": "Agent Reach mesh (MCP)"})

    def _caller(self, request: web.Request) -> Identity:
        """Who sends the request: with authentication on, nobody without a valid credential (401)."""
        origin = request.headers.get("Origin")
        if origin is not None and URL(origin).raw_authority != request.host:
            # The spec's guard against DNS rebinding: a page elsewhere must not drive a local router.
            raise ApiError(403, "forbidden_origin", f"Origin {origin!r} is not this server's", "Origin")
        caller = self.auth.authenticate(request.headers) if self.auth is not None else None
        if isinstance(caller, Unauthenticated):
            challenge = f'Bearer realm="agentreach", resource_metadata="{self._base_url(request)}{METADATA_PATH}/mcp"'
            raise ApiError(401, "unauthenticated", caller.message, "Authorization",
                           headers={"WWW-Authenticate": challenge})
        return caller

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """The session's stream (one per session): a list_changed notification each time the caller's tools
        differ from what they were when the stream opened or last notified. The view changes only through
        the feed, so the stream wakes on the mirror's changes, never by polling."""
        caller = self._caller(request)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            raise ApiError(400, "missing_session", f"GET /mcp needs the {SESSION_HEADER} that initialize gave",
                           SESSION_HEADER)
        owner = _owner(caller)
        session = self.sessions.find(session_id, owner)
        if session is None:
            raise ApiError(404, "unknown_session", "No such session: initialize a new one", SESSION_HEADER)
        if session.streaming:
            raise ApiError(409, "stream_open", "This session's stream is already open", SESSION_HEADER)
        if self.sessions.streaming >= MAX_STREAMS or \
                (owner is not None and self.sessions.streaming_for(owner) >= MAX_STREAMS_PER_CLIENT):
            raise ApiError(429, "too_many_streams", "Too many MCP streams are open: close one, or list tools "
                                                    "again instead of waiting for notifications", SESSION_HEADER)
        session.streaming = True
        response = web.StreamResponse(headers=STREAM_HEADERS)
        watch = asyncio.ensure_future(self._watch(request, response, caller, session, session_id))
        try:
            with on_disconnect(request, watch.cancel):
                await watch
        except (asyncio.CancelledError, ConnectionError):
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        finally:
            session.streaming = False
        return response

    async def _watch(self, request: web.Request, response: web.StreamResponse, caller: Identity,
                     session: Session, session_id: str) -> None:
        await response.prepare(request)
        owner = _owner(caller)
        listed = self._tool_list(caller)
        while True:
            await _first_of(self.router.mirror.next_change(), session.ended.wait(), KEEPALIVE_SECONDS)
            if self.sessions.find(session_id, owner) is None:
                return
            if self.auth is not None:
                caller = self.auth.authenticate(request.headers)
                if isinstance(caller, Unauthenticated):
                    return  # the credential expired or was revoked: the client must come back with a new one
            tools = self._tool_list(caller)
            if tools != listed:
                await response.write(_event({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
                listed = tools
            else:
                await response.write(b": keepalive\n\n")

    async def delete(self, request: web.Request) -> web.Response:
        caller = self._caller(request)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None or not self.sessions.end(session_id, _owner(caller)):
            raise ApiError(404, "unknown_session", "No such session", SESSION_HEADER)
        return web.Response(status=204)

    async def post(self, request: web.Request) -> web.StreamResponse:
        caller = self._caller(request)
        rpc_id: Any = None
        try:
            message = await self._message(request)
            if "method" not in message:
                if "result" in message or "error" in message:
                    return web.Response(status=202)  # an answer to a request: the router makes none
                raise McpError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message: no method", status=400)
            if "id" not in message:
                return web.Response(status=202)  # a notification (initialized, cancelled...): nothing to answer
            rpc_id = message["id"]
            if not isinstance(rpc_id, (str, int)) or isinstance(rpc_id, bool):
                rpc_id = None
                raise McpError(INVALID_REQUEST, "id must be a string or a number", status=400)
            params = message.get("params", {})
            if not isinstance(params, dict):
                raise McpError(INVALID_PARAMS, "params must be an object")
            return await self._request(request, caller, rpc_id, message["method"], params)
        except McpError as error:
            return json_response(_error_body(rpc_id, error), error.status)

    async def _message(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise McpError(INVALID_REQUEST, "Request body exceeds the router's size limit", status=413) from None
        if peer_json.depth_exceeds(raw, peer_json.MAX_CALLER_DEPTH):
            raise McpError(INVALID_REQUEST, "JSON nests deeper than the router accepts", status=400)
        try:
            message = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise McpError(PARSE_ERROR, f"Parse error: {exc}", status=400) from None
        if isinstance(message, list):
            raise McpError(INVALID_REQUEST, "JSON-RPC batches are not part of MCP since 2025-06-18: send one "
                                            "message per request", status=400)
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise McpError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message", status=400)
        if "method" in message and not isinstance(message["method"], str):
            raise McpError(INVALID_REQUEST, "method must be a string", status=400)
        return message

    # JSON-RPC

    async def _request(self, request: web.Request, caller: Identity, rpc_id: str | int, method: str,
                       params: dict[str, Any]) -> web.StreamResponse:
        if method == "initialize":
            return self._initialize(caller, rpc_id, params)
        if method not in ("ping", "tools/list", "tools/call"):
            raise McpError(METHOD_NOT_FOUND, f"Method not found: {method!r}; this server takes initialize, ping, "
                                             "tools/list and tools/call")
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in PROTOCOL_VERSIONS:
            raise McpError(INVALID_REQUEST, f"Unsupported {VERSION_HEADER} {version!r}; supported: "
                                            f"{', '.join(PROTOCOL_VERSIONS)}", status=400)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is not None and self.sessions.find(session_id, _owner(caller)) is None:
            raise McpError(SESSION_NOT_FOUND, "Session not found: initialize a new one", status=404)
        if method == "ping":
            return json_response(_answer(rpc_id, {}))
        if method == "tools/list":
            return json_response(_answer(rpc_id, {"tools": self._tools(caller)}))
        return await self._call(request, caller, rpc_id, params)

    def _initialize(self, caller: Identity, rpc_id: str | int, params: dict[str, Any]) -> web.Response:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise McpError(INVALID_PARAMS, "params.protocolVersion must be a string")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        session_id = self.sessions.begin(_owner(caller), version)
        result = {"protocolVersion": version, "capabilities": {"tools": {"listChanged": True}},
                  "serverInfo": SERVER_INFO, "instructions": INSTRUCTIONS}
        return json_response(_answer(rpc_id, result), headers={SESSION_HEADER: session_id})

    def _tool_list(self, caller: Identity) -> bytes:
        """The caller's tools as JSON, derived once per change of the view for all the streams whose callers
        hold the same grants and trust (all that decides which tools one sees), not once per stream."""
        changes = self.router.mirror.changes
        if self._listed_at != changes:
            self._listed.clear()
            self._listed_at = changes
        seen_as = (caller.trust_level, tuple(caller.grants)) if isinstance(caller, Caller) else None
        listed = self._listed.get(seen_as)
        if listed is None:
            listed = self._listed[seen_as] = _encoder.encode(self._tools(caller))
        return listed

    def _tools(self, caller: Identity) -> list[dict[str, Any]]:
        plans = self.router.plans
        return [tool_of(name, plan.offers) for name in self.router.mirror.capability_names()
                if (plan := plans.of(name)) is not None and may_call(caller, plan)]

    async def _call(self, request: web.Request, caller: Identity, rpc_id: str | int,
                    params: dict[str, Any]) -> web.StreamResponse:
        name, arguments, meta = params.get("name"), params.get("arguments", {}), params.get("_meta", {})
        if not isinstance(name, str):
            raise McpError(INVALID_PARAMS, "params.name must be the tool's name")
        if not isinstance(arguments, dict):
            raise McpError(INVALID_PARAMS, "params.arguments must be an object")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if token is not None and (not isinstance(token, (str, int)) or isinstance(token, bool)):
            raise McpError(INVALID_PARAMS, "params._meta.progressToken must be a string or a number")
        checked = self.check(RequestFrame(capability=name,
                                          payload=payload_of(arguments, self.router.mirror.offers(name))))
        if isinstance(checked, CallResult):
            assert isinstance(checked.frame, ErrorFrame)
            raise _refusal(checked.frame)
        checked.stream = token is not None
        progress = Progress(request, token) if token is not None else None
        with logs.bind(request_id=checked.request_id, capability=checked.capability):
            call = asyncio.ensure_future(self.router.call(checked, caller, parent_of(request.headers),
                                                          Relay(progress) if progress is not None else None))
            with on_disconnect(request, call.cancel):
                try:
                    result = await call
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    return (progress.response if progress is not None else None) or web.Response()
        message = self._result(rpc_id, result.frame)
        return await progress.end(message) if progress is not None else json_response(message)

    @staticmethod
    def _result(rpc_id: str | int, frame: ResponseFrame | ErrorFrame) -> dict[str, Any]:
        if isinstance(frame, ResponseFrame):
            return _answer(rpc_id, success(frame))
        if is_business_failure(frame):
            return _answer(rpc_id, business_failure(frame))
        return _error_body(rpc_id, _refusal(frame))


async def _first_of(first: Awaitable[Any], second: Awaitable[Any], timeout: float) -> None:
    """Returns when either awaitable is done or ``timeout`` passes; the other is cancelled."""
    waiters = {asyncio.ensure_future(first), asyncio.ensure_future(second)}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _owner(caller: Identity) -> str | None:
    return caller.client_id if isinstance(caller, Caller) else None
