"""The router's OpenAPI 3.1 document: every route router/api.py serves, declared with the Structs its
handlers decode and answer (weblayer/openapi.py builds the document from them). What is served depends on
the router's settings (authentication on, an audit trail kept), so the document is built per combination."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from agent_reach.atp import ErrorFrame, RequestFrame, ResponseFrame
from aiohttp import web
from aiohttp.typedefs import Handler

from router.app_keys import AUDIT_KEY, AUTH_KEY
from router.audit import AuditEntry
from router.inspection import MAX_TRACES_LISTED
from router.jsonrpc import METHOD
from router.mcp.endpoint import METADATA_PATH
from router.merged import AlertsAnswer, RuleStats, Scores, TraceAnswer
from router.oauth import TokenAnswer
from router.reach import ReachView
from router.traces import CallTrace
from router.usage import Period, PeriodUsage
from weblayer.openapi import (
    API_KEY,
    BEARER,
    OPENAPI_JSON,
    Body,
    Operation,
    document,
    handler,
    header,
    query,
    self_description,
)

CALLER = ("clientKey", "bearer")
ADMIN = ("adminKey", "adminBearer")
SECURITY_SCHEMES = {
    "clientKey": {**API_KEY, "description": "A client's API key (agentreach clients create)"},
    "bearer": {
        **BEARER,
        "bearerFormat": "JWT",
        "description": "An access token from POST /oauth/token, or a client's API key as a bearer",
    },
    "adminKey": {**API_KEY, "description": "The admin key"},
    "adminBearer": {**BEARER, "description": "The admin key as a bearer"},
}
JSON_RPC = Body(
    "A JSON-RPC 2.0 message (or batch): its result, or its error object", schema={"type": ["object", "array"]}
)
# The atp call statuses (agent_reach.atp.ErrorCode's table) and the router's own refusals.
CALL_ERRORS = (400, 401, 403, 404, 413, 422, 429, 431, 500, 502, 503, 504)
ROUTE_HEADERS = header("X-Reach-Route-Headers", "Any value: the routing facts also as X-Reach-* answer headers")
CAPABILITY_FILTER = query("capability", "Only this capability's")


class CompletionNoted(msgspec.Struct):
    """POST /completions' answer: whether the router still knew the call."""

    request_id: str
    known: bool


class EmbeddingModel(msgspec.Struct):
    """One stage of intent matching: its model, vector size, where its rule came from, and the languages its
    calibration keeps it from deciding."""

    model: str
    dimensions: int
    rule: str
    off_languages: list[str]


class Health(msgspec.Struct):
    """GET /healthz: whether the router has loaded the registry, and its share of the cluster's limits;
    with semantic matching on, the embedding models intents are matched with, in the order they are asked."""

    status: str
    registry_synced: bool
    revision: int
    capabilities: int
    router_id: str
    routers: int
    limit_share: float
    embedding_models: list[EmbeddingModel] | None = None


class Usage(msgspec.Struct):
    period: Period
    periods: list[PeriodUsage]


class Traces(msgspec.Struct):
    traces: list[CallTrace]


class AuditEntries(msgspec.Struct):
    entries: list[AuditEntry]


class OAuthError(msgspec.Struct):
    """RFC 6749 §5.2's error body, ``field`` naming the parameter at fault."""

    error: str
    error_description: str
    field: str | None


class KeysRotated(msgspec.Struct):
    kid: str
    jwks: dict[str, Any]


class ResourceMetadata(msgspec.Struct):
    """RFC 9728's protected resource metadata for /mcp."""

    resource: str
    authorization_servers: list[str]
    token_endpoint: str
    bearer_methods_supported: list[str]
    resource_name: str


JWKS = Body("The keys that verify access tokens, as a JWK set (RFC 7517)", schema={"type": "object"})
TOKEN_REQUEST = Body(
    "Client credentials (RFC 6749 §4.4), the client's id and secret here or in HTTP Basic",
    "application/x-www-form-urlencoded",
    {
        "type": "object",
        "properties": {
            "grant_type": {"type": "string", "enum": ["client_credentials"]},
            "client_id": {"type": "string"},
            "client_secret": {"type": "string"},
            "scope": {"type": "string"},
        },
        "required": ["grant_type"],
    },
)
AGENT_CARD = Body("An A2A Agent Card", schema={"type": "object"})


def _admin(method: str, path: str, summary: str, answers: dict[int, Any], **fields: Any) -> Operation:
    errors = sorted({431, *fields.pop("errors", ())})
    return Operation(method, path, summary, answers, security=ADMIN, errors=errors, tags=("operators",), **fields)


def _open(method: str, path: str, summary: str, answers: dict[int, Any], **fields: Any) -> Operation:
    errors = sorted({431, *fields.pop("errors", ())})
    return Operation(method, path, summary, answers, errors=errors, **fields)


def _calls() -> list[Operation]:
    security = CALLER
    return [
        Operation(
            "POST",
            "/atp",
            "Call a capability: an ATP request frame, or JSON-RPC 2.0 envelopes carrying frames (a batch's calls "
            "run at once); Accept: text/event-stream (or stream: true) streams the answer",
            {200: (ResponseFrame, JSON_RPC), 204: None},
            request=(RequestFrame, JSON_RPC),
            errors=CALL_ERRORS,
            error_answer=(ErrorFrame, JSON_RPC),
            security=security,
            parameters=(ROUTE_HEADERS,),
            examples={
                "frame": {"capability": "echo", "payload": {"text": "hello"}},
                "json-rpc": {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": METHOD,
                    "params": {"capability": "echo", "payload": "hello"},
                },
                "batch": [
                    {"jsonrpc": "2.0", "id": n, "method": METHOD, "params": {"capability": "echo"}} for n in (1, 2)
                ],
            },
            tags=("calls",),
        ),
        Operation(
            "GET",
            "/.well-known/agent-card.json",
            "The A2A Agent Card of every capability this caller may call",
            {200: AGENT_CARD},
            errors=(431,),
            security=security,
            tags=("a2a",),
        ),
        Operation(
            "GET",
            "/a2a/{capability}/.well-known/agent-card.json",
            "One capability's A2A Agent Card",
            {200: AGENT_CARD},
            errors=(404, 431),
            security=security,
            tags=("a2a",),
        ),
        Operation(
            "POST",
            "/a2a",
            "A2A JSON-RPC: message/send, message/stream, tasks/get, tasks/cancel",
            {200: JSON_RPC},
            request=JSON_RPC,
            errors=(431,),
            error_answer=JSON_RPC,
            security=security,
            tags=("a2a",),
        ),
        Operation(
            "POST",
            "/a2a/{capability}",
            "A2A JSON-RPC to one capability",
            {200: JSON_RPC},
            request=JSON_RPC,
            errors=(404, 431),
            error_answer=JSON_RPC,
            security=security,
            tags=("a2a",),
        ),
        Operation(
            "POST",
            "/mcp",
            "MCP (Streamable HTTP): initialize, tools/list, tools/call",
            {200: JSON_RPC, 202: None},
            request=JSON_RPC,
            errors=(404, 405, 406, 409, 415, 429, 431),
            error_answer=JSON_RPC,
            security=security,
            parameters=(header("Mcp-Session-Id", "The session initialize gave"),),
            tags=("mcp",),
        ),
        Operation(
            "GET",
            "/mcp",
            "A session's stream of notifications (tools/list_changed)",
            {200: Body("Server-sent events", "text/event-stream", {"type": "string"})},
            errors=(400, 404, 409, 429, 431),
            security=security,
            parameters=(header("Mcp-Session-Id", "The session initialize gave"),),
            tags=("mcp",),
        ),
        Operation(
            "DELETE",
            "/mcp",
            "End a session",
            {204: None},
            errors=(400, 404, 431),
            security=security,
            parameters=(header("Mcp-Session-Id", "The session initialize gave"),),
            tags=("mcp",),
        ),
    ]


def _open_operations(completion: type) -> list[Operation]:
    return [
        _open(
            "POST",
            "/completions",
            "An agent's late completion of a call the router gave up on",
            {200: CompletionNoted},
            request=completion,
        ),
        _open("GET", "/healthz", "Whether the router has loaded the registry", {200: Health}),
        _open("GET", "/metrics", "Prometheus metrics", {200: Body("Prometheus text exposition", "text/plain")}),
        self_description(),
    ]


INSPECTION = [
    _admin("GET", "/reach", "Reach and route decisions per period", {200: ReachView}, parameters=(CAPABILITY_FILTER,)),
    _admin("GET", "/alerts", "Reach alerts, rollbacks and degraded capabilities", {200: AlertsAnswer}),
    _admin(
        "GET",
        "/rules/stats",
        "Hits per live rule, shadow rules' agreement",
        {200: RuleStats},
        parameters=(CAPABILITY_FILTER,),
    ),
    _admin(
        "GET",
        "/usage",
        "Calls, tokens and cost metered per period",
        {200: Usage},
        errors=(400,),
        parameters=(
            query("period", "hour or day", {"type": "string", "enum": ["hour", "day"]}),
            query("client", "Only this client's"),
            CAPABILITY_FILTER,
        ),
    ),
    _admin(
        "GET", "/scores/{capability}", "Every instance's score under the scored policy", {200: Scores}, errors=(404,)
    ),
    _admin(
        "GET",
        "/traces",
        "Recent calls, newest first",
        {200: Traces},
        errors=(400,),
        parameters=(
            query("limit", "How many", {"type": "integer", "minimum": 1, "maximum": MAX_TRACES_LISTED}),
            CAPABILITY_FILTER,
        ),
    ),
    _admin("GET", "/traces/{request_id}", "One call's trace and its attempts", {200: TraceAnswer}, errors=(404,)),
]
AUDIT = _admin(
    "GET",
    "/audit",
    "The audit trail, filtered",
    {200: AuditEntries},
    errors=(400,),
    parameters=(
        *(query(name, f"Only this {name}'s entries") for name in ("capability", "caller", "request_id", "trace_id")),
        query("since", "From this moment: unix seconds or ISO 8601 with an offset"),
        query("until", "Until this moment: unix seconds or ISO 8601 with an offset"),
        query("limit", "How many entries", {"type": "integer", "minimum": 1}),
    ),
)
OAUTH = [
    _open(
        "POST",
        "/oauth/token",
        "Client credentials in, a signed access token out",
        {200: TokenAnswer},
        request=TOKEN_REQUEST,
        errors=(400, 401),
        error_answer=OAuthError,
    ),
    _open("GET", "/.well-known/jwks.json", "The keys that verify access tokens", {200: JWKS}),
    _open("GET", METADATA_PATH, "Where tokens for /mcp come from (RFC 9728)", {200: ResourceMetadata}),
    _open("GET", f"{METADATA_PATH}/mcp", "Where tokens for /mcp come from (RFC 9728)", {200: ResourceMetadata}),
    _admin("POST", "/oauth/keys/rotate", "A new token signing key", {200: KeysRotated}),
]


@functools.cache
def router_document(auth: bool, audit: bool) -> dict[str, Any]:
    """What a router with these settings serves (router/api.py's create_app), built once per process. With
    authentication off the same credentials are declared, and not checked."""
    from router.api import Completion  # here: router/api.py imports this module

    operations = [
        *_calls(),
        *_open_operations(Completion),
        *INSPECTION,
        *([AUDIT] if audit else []),
        *(OAUTH if auth else []),
    ]
    return document(
        "Agent Reach router",
        "Callers reach capabilities here (ATP, JSON-RPC, A2A, MCP); operators inspect routing. Errors answer "
        "{error, message, field}; a call's, an ATP error frame.",
        operations,
        SECURITY_SCHEMES,
    )


@functools.cache
def _served(auth: bool, audit: bool) -> Handler:
    return handler(router_document(auth, audit))


async def openapi_json(request: web.Request) -> web.StreamResponse:
    """GET /openapi.json (open): the document of what this router serves."""
    return await _served(AUTH_KEY in request.app, AUDIT_KEY in request.app)(request)


OPENAPI_ROUTE = ("GET", OPENAPI_JSON, openapi_json)
