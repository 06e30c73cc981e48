"""The registry's OpenAPI 3.1 document: every route registry/api.py serves, declared with the Structs its
handlers decode and answer (weblayer/openapi.py builds the document from them)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from agent_reach.registration import AgentRef, CapabilityRef, HeartbeatRequest, Name, RegisterRequest

from auth.records import (
    ClientBudget,
    ClientCreate,
    ClientSecrets,
    ClientView,
    IssuedToken,
    PublishedKey,
    TokenCreate,
    TokenView,
)
from mesh.alerts import AlertConfig
from mesh.budgets import BudgetView, LeaseGrant, LeaseRequest
from mesh.cluster import ClusterView
from mesh.examples import Confirmation, ExampleSettings, ExampleSummary, ExampleView, NewExample, Rejection
from mesh.intent_rules import IntentRule
from mesh.policy import Policy
from mesh.quality import QualityAlert, QualityPost, QualityView
from registry.budgets import BudgetPage
from registry.lifecycle import Status
from registry.views import AgentView, QueryResult
from weblayer.openapi import API_KEY, BEARER, Body, Operation, document, header, query, self_description

AGENT = ("registrationToken", "registrationBearer")
ADMIN = ("adminKey", "adminBearer")
SECURITY_SCHEMES = {
    "registrationToken": {**API_KEY, "description": "An agent's registration token (or the admin key)"},
    "registrationBearer": {**BEARER, "description": "The registration token (or the admin key) as a bearer"},
    "adminKey": {**API_KEY, "description": "The admin key (DATA_DIR/admin.key)"},
    "adminBearer": {**BEARER, "description": "The admin key as a bearer"},
}
WATCH_FEED = Body(
    "Newline-delimited JSON events of every change (mesh/watch.py), open until the follower leaves",
    "application/x-ndjson",
    {"type": "string"},
)
METRICS = Body("Prometheus text exposition", "text/plain", {"type": "string"})


class Heartbeat(msgspec.Struct):
    agent_id: str
    state: Status


class Deregistered(msgspec.Struct):
    agent_id: str
    deregistered: bool


class Health(msgspec.Struct, kw_only=True):
    """GET /healthz: ok, or (503) the storage outage or stale view, in the error envelope beside the status."""

    status: str
    revision: int
    error: str | None = None
    message: str | None = None
    field: str | None = None
    since: float | None = None
    stale_seconds: float | None = None


class Agents(msgspec.Struct):
    agents: list[AgentView]


class Policies(msgspec.Struct):
    policies: list[Policy]


class PolicyDeleted(msgspec.Struct):
    capability: str
    deleted: bool


class IntentRuleDeleted(msgspec.Struct):
    model: str
    deleted: bool


class ExampleDeleted(msgspec.Struct):
    capability: str
    id: str
    deleted: bool


class QualityAlerts(msgspec.Struct):
    alerts: list[QualityAlert]


class QualityDeleted(msgspec.Struct):
    capability: str
    agent_id: str
    deleted: bool


class Clients(msgspec.Struct):
    clients: list[ClientView]


class Tokens(msgspec.Struct):
    tokens: list[TokenView]


class Keys(msgspec.Struct):
    keys: list[PublishedKey]


class AdminKeyRotated(msgspec.Struct):
    admin_key: str
    stored_in: str


def _admin(method: str, path: str, summary: str, answers: dict[int, Any], **fields: Any) -> Operation:
    """An operators' endpoint: the admin key, and a storage outage (503) possible on any of them."""
    errors = sorted({503, *fields.pop("errors", ())})
    return Operation(
        method,
        path,
        summary,
        answers,
        security=ADMIN,
        errors=errors,
        tags=("operators",),
        path_types=CAPABILITY_PATH,
        **fields,
    )


# A capability in a path is held to the same rules as in a body (registry/api.py's path_capability).
CAPABILITY_PATH = {"capability": Name, "model": Name}
# The examples' instance: one of an echo service.
ECHO_INSTANCE = {
    "agent_id": "echo-1",
    "service": "echo",
    "base_url": "http://127.0.0.1:9001",
    "capabilities": [{"name": "echo", "endpoint": "/echo", "protocol": "rest"}],
}
POLICY_ETAG = "The ETag of the policy the write is based on (* for any)"
OPERATIONS: list[Operation] = [
    Operation(
        "POST",
        "/register",
        "Register an instance and its capabilities",
        {200: AgentView},
        request=RegisterRequest,
        errors=(409, 503),
        security=AGENT,
        examples={"echo": ECHO_INSTANCE},
        tags=("agents",),
    ),
    Operation(
        "POST",
        "/heartbeat",
        "An instance's heartbeat: its load and health",
        {200: Heartbeat},
        request=HeartbeatRequest,
        errors=(404, 503),
        security=AGENT,
        examples={"echo": {"agent_id": "echo-1", "load": 0.2}},
        tags=("agents",),
    ),
    Operation(
        "POST",
        "/deregister",
        "Remove an instance",
        {200: Deregistered},
        request=AgentRef,
        errors=(404, 503),
        security=AGENT,
        examples={"echo": {"agent_id": "echo-1"}},
        tags=("agents",),
    ),
    Operation(
        "POST",
        "/query",
        "The instances offering a capability (agents' direct fallback)",
        {200: QueryResult},
        request=CapabilityRef,
        errors=(404,),
        security=AGENT,
        examples={"echo": {"capability": "echo"}},
        tags=("agents",),
    ),
    Operation(
        "GET", "/healthz", "Whether the registry can store changes and its view is current", {200: Health, 503: Health}
    ),
    Operation("GET", "/metrics", "Prometheus metrics", {200: METRICS}),
    Operation(
        "POST",
        "/cluster/gossip",
        "Soft state from another registry node, signed with the cluster's node key",
        {204: None},
        request=Body("A signed gossip message (registry/gossip.py)", "application/octet-stream", {"type": "string"}),
        errors=(400, 401, 404),
        parameters=(header("X-AgentReach-Signature", "The message's HMAC under the node key"),),
    ),
    self_description(),
    _admin("GET", "/agents", "Every instance, evicted ones kept as history", {200: Agents}),
    _admin("GET", "/agents/{agent_id}", "One instance", {200: AgentView}, errors=(404,)),
    _admin("GET", "/policies", "Every stored routing policy", {200: Policies}),
    _admin(
        "GET",
        "/policies/{capability}",
        "A capability's routing policy (with its ETag)",
        {200: Policy},
        errors=(400, 404),
    ),
    _admin(
        "PUT",
        "/policies/{capability}",
        "Write a capability's routing policy, conditionally with If-Match",
        {200: Policy},
        request=Policy,
        errors=(404, 409),
        parameters=(header("If-Match", POLICY_ETAG), header("If-None-Match", "* : create only")),
    ),
    _admin(
        "DELETE",
        "/policies/{capability}",
        "Delete a capability's routing policy",
        {200: PolicyDeleted},
        errors=(400, 404),
    ),
    _admin("GET", "/settings/alerts", "The reach alerts' thresholds", {200: AlertConfig}),
    _admin("PUT", "/settings/alerts", "Set the reach alerts' thresholds", {200: AlertConfig}, request=AlertConfig),
    _admin("GET", "/examples", "Learned phrasings, counted per capability", {200: list[ExampleSummary]}),
    _admin(
        "GET", "/examples/{capability}", "A capability's learned phrasings", {200: list[ExampleView]}, errors=(400,)
    ),
    _admin(
        "POST", "/examples/{capability}", "Add a phrasing", {201: ExampleView}, request=NewExample, errors=(404, 409)
    ),
    _admin(
        "POST",
        "/examples/{capability}/confirmations",
        "A router's report of a caller's confirmed intent",
        {200: ExampleView, 204: None},
        request=Confirmation,
        errors=(404, 409),
    ),
    _admin(
        "GET",
        "/examples/{capability}/settings",
        "When confirmed phrasings are accepted by themselves",
        {200: ExampleSettings},
        errors=(400,),
    ),
    _admin(
        "PUT",
        "/examples/{capability}/settings",
        "Set when confirmed phrasings are accepted",
        {200: ExampleSettings},
        request=ExampleSettings,
        errors=(404,),
    ),
    _admin(
        "POST",
        "/examples/{capability}/{example_id}/accept",
        "Accept a phrasing",
        {200: ExampleView},
        errors=(400, 404, 409),
    ),
    _admin(
        "POST",
        "/examples/{capability}/{example_id}/reject",
        "Reject a phrasing, saying why or not",
        {200: ExampleView},
        request=Rejection,
        request_required=False,
        errors=(400, 404, 413),
    ),
    _admin(
        "DELETE", "/examples/{capability}/{example_id}", "Delete a phrasing", {200: ExampleDeleted}, errors=(400, 404)
    ),
    _admin(
        "GET", "/intent-rules", "Every embedding model's calibrated intent rule, by model", {200: dict[str, IntentRule]}
    ),
    _admin("GET", "/intent-rules/{model}", "One model's intent rule", {200: IntentRule}, errors=(400, 404)),
    _admin(
        "PUT",
        "/intent-rules/{model}",
        "Store a model's intent rule (what `agentreach intents calibrate` fitted): every router running it uses it",
        {200: IntentRule},
        request=IntentRule,
        errors=(400,),
    ),
    _admin(
        "DELETE", "/intent-rules/{model}", "Remove a model's intent rule", {200: IntentRuleDeleted}, errors=(400, 404)
    ),
    _admin("GET", "/quality", "Quality scores under their capability's floor", {200: QualityAlerts}),
    _admin("GET", "/quality/{capability}", "A capability's quality scores", {200: list[QualityView]}, errors=(400,)),
    _admin(
        "PUT",
        "/quality/{capability}/{agent_id}",
        "Score an instance's quality",
        {200: QualityView},
        request=QualityPost,
        errors=(404,),
    ),
    _admin(
        "DELETE",
        "/quality/{capability}/{agent_id}",
        "Remove an instance's quality score",
        {200: QualityDeleted},
        errors=(400, 404),
    ),
    _admin(
        "GET",
        "/watch",
        "Follow every change from a revision on (routers follow this)",
        {200: WATCH_FEED},
        errors=(400, 404),
        parameters=(
            query("since", "Resume after this revision", {"type": "string", "pattern": "^[0-9]+$"}),
            query("router", "The follower is the router with this id"),
        ),
    ),
    _admin("GET", "/cluster", "The registry nodes, the leader, etcd's health and the routers", {200: ClusterView}),
    _admin(
        "POST",
        "/clients",
        "Create a caller; its secrets are shown once",
        {201: ClientSecrets},
        request=ClientCreate,
        errors=(409,),
    ),
    _admin("GET", "/clients", "Every caller (never a secret)", {200: Clients}),
    _admin("GET", "/clients/{client_id}", "One caller", {200: ClientView}, errors=(404,)),
    _admin("POST", "/clients/{client_id}/disable", "Disable a caller", {200: ClientView}, errors=(404, 409)),
    _admin("POST", "/clients/{client_id}/enable", "Enable a caller", {200: ClientView}, errors=(404, 409)),
    _admin(
        "POST",
        "/clients/{client_id}/rotate",
        "New secrets for a caller, shown once",
        {200: ClientSecrets},
        errors=(404, 409),
    ),
    _admin(
        "PUT",
        "/clients/{client_id}/budget",
        "Replace a caller's budget",
        {200: ClientView},
        request=ClientBudget,
        errors=(404, 409),
    ),
    _admin(
        "GET",
        "/budgets",
        "Every budgeted caller's account, a page in client id order",
        {200: BudgetPage},
        errors=(400,),
        parameters=(
            query("after", "The last client id of the previous page"),
            query("limit", "How many accounts", {"type": "integer", "minimum": 1}),
        ),
    ),
    _admin("GET", "/budgets/{client_id}", "A caller's budget account", {200: BudgetView}, errors=(404,)),
    _admin(
        "POST",
        "/budgets/{client_id}/lease",
        "A router's spend so far and its next chunk of the budget",
        {200: LeaseGrant},
        request=LeaseRequest,
        errors=(404,),
    ),
    _admin(
        "POST", "/tokens", "Create an agent registration token, shown once", {201: IssuedToken}, request=TokenCreate
    ),
    _admin("GET", "/tokens", "Every registration token (never a secret)", {200: Tokens}),
    _admin(
        "POST",
        "/tokens/{token_id}/revoke",
        "Revoke a registration token (its instances are evicted)",
        {200: TokenView},
        errors=(404,),
    ),
    _admin("GET", "/signing-keys", "Routers' published token verifying keys", {200: Keys}),
    _admin("PUT", "/signing-keys", "A router's verifying keys", {200: Keys}, request=list[PublishedKey]),
]
# Only with auth on and a data dir to write the new key to (registry/api.py's ROTATE_ADMIN_KEY).
ROTATE_ADMIN_KEY = _admin(
    "POST", "/admin-key/rotate", "A new admin key, shown once; the old one stops working", {200: AdminKeyRotated}
)


@functools.cache
def registry_document(rotates_admin_key: bool) -> dict[str, Any]:
    """Built once per process: every registry app serves the same one."""
    operations = [*OPERATIONS, ROTATE_ADMIN_KEY] if rotates_admin_key else OPERATIONS
    return document(
        "Agent Reach registry",
        "Agents register and heartbeat here; operators manage "
        "policies, callers and tokens. Errors answer {error, message, field}.",
        operations,
        SECURITY_SCHEMES,
    )
