"""The console's OpenAPI 3.1 document: every route console/api.py and console/signin.py serve, declared with
the Structs the handlers answer and, where the console relays the registry or the router, the Structs those
answer (weblayer/openapi.py builds the document from them)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from agent_reach.atp import RequestFrame

from auth.records import ClientBudget, ClientView
from console.models import (
    AgentDetail,
    AgentRow,
    ConsoleConfig,
    DebugResult,
    Overview,
    PolicyEntry,
    ReachView,
    RoutesView,
)
from console.signin import COOKIE, SignIn
from mesh.alerts import AlertConfig
from mesh.budgets import BudgetView
from mesh.cluster import ClusterView
from mesh.examples import ExampleSummary
from mesh.policy import Policy
from registry.openapi import PolicyDeleted, QualityAlerts
from router.inspection import MAX_TRACES_LISTED
from router.merged import AlertsAnswer, RuleStats, Scores, TraceAnswer
from router.traces import CallTrace
from weblayer.openapi import API_KEY, BEARER, Body, Operation, document, header, query, self_description

ADMIN = ("adminKey", "adminBearer", "session")
SECURITY_SCHEMES = {
    "adminKey": {**API_KEY, "description": "The admin key"},
    "adminBearer": {**BEARER, "description": "The admin key as a bearer"},
    "session": {
        "type": "apiKey",
        "in": "cookie",
        "name": COOKIE,
        "description": "A signed-in browser's session (POST /api/session)",
    },
}
# Relayed from the registry or the router as they answered, their errors included (405 too: a method the
# registry does not serve on a relayed path).
UPSTREAM_ERRORS = (400, 404, 409, 502)
HOURS = query("hours", "How many hours of history", {"type": "integer", "minimum": 1, "maximum": 24 * 7})
RELAYED = Body(
    "The registry's answer, relayed as it came (see the registry's document)", schema={"type": ["object", "array"]}
)


class SessionState(msgspec.Struct):
    auth: str
    signed_in: bool


class Agents(msgspec.Struct):
    agents: list[AgentRow]


class TracePage(msgspec.Struct):
    traces: list[CallTrace]
    offset: int
    more: bool


class NamedTrace(TraceAnswer, kw_only=True):
    """The router's trace and the names of the clients who made its calls."""

    caller_names: dict[str, str]


class Policies(msgspec.Struct):
    policies: list[PolicyEntry]


class ClientAccount(ClientView, kw_only=True):
    """A client and its account for the period (None: no budget, or the accounts were unreadable)."""

    account: BudgetView | None


class Clients(msgspec.Struct):
    clients: list[ClientAccount]


def _admin(method: str, path: str, summary: str, answers: dict[int, Any], **fields: Any) -> Operation:
    return Operation(method, path, summary, answers, security=ADMIN, tags=("operators",), **fields)


def _relayed(method: str, path: str, summary: str, **fields: Any) -> Operation:
    return _admin(method, path, summary, {200: RELAYED}, errors=(*UPSTREAM_ERRORS, 405), **fields)


OPERATIONS = [
    Operation("GET", "/", "The console's page", {200: Body("The page", "text/html", {"type": "string"})}),
    Operation("GET", "/healthz", "Whether the console's last poll could read each part", {200: Body("Health")}),
    Operation("GET", "/metrics", "Prometheus metrics", {200: Body("Prometheus text exposition", "text/plain")}),
    self_description(),
    Operation("GET", "/api/session", "Whether this browser is signed in", {200: SessionState}),
    Operation(
        "POST",
        "/api/session",
        "Sign in with the admin key (sets the session cookie)",
        {200: SessionState},
        request=SignIn,
        errors=(401, 403),
    ),
    Operation("DELETE", "/api/session", "Sign out", {200: SessionState}),
    _admin("GET", "/api/config", "The console's settings", {200: ConsoleConfig}),
    _admin("GET", "/api/overview", "The mesh at a glance", {200: Overview}),
    _admin(
        "GET",
        "/api/stream",
        "Live updates as server-sent events",
        {200: Body("Server-sent events", "text/event-stream", {"type": "string"})},
        errors=(400,),
        parameters=(query("topics", "Comma-separated: overview, agents"),),
    ),
    _admin("GET", "/api/agents", "Every instance and its traffic", {200: Agents}),
    _admin(
        "GET",
        "/api/agents/{agent_id}",
        "One instance: heartbeats, transitions, traffic, hours",
        {200: AgentDetail},
        errors=(400, 404, 502),
        parameters=(HOURS,),
    ),
    _admin("GET", "/api/reach", "Reach over time", {200: ReachView}, errors=(400,), parameters=(HOURS,)),
    _admin("GET", "/api/routes", "Route decisions over time", {200: RoutesView}, errors=(400,), parameters=(HOURS,)),
    _admin(
        "GET",
        "/api/traces",
        "A page of the router's recent calls",
        {200: TracePage},
        errors=(400, 502),
        parameters=(
            query("limit", "How many", {"type": "integer", "minimum": 1, "maximum": MAX_TRACES_LISTED}),
            query("offset", "After this many", {"type": "integer", "minimum": 0}),
            query("capability", "Only this capability's"),
        ),
    ),
    _admin(
        "GET",
        "/api/traces/{request_id}",
        "One call's trace and its callers' names",
        {200: NamedTrace},
        errors=(404, 502),
    ),
    _admin("GET", "/api/policies", "Every capability's policy, stored or the default", {200: Policies}, errors=(502,)),
    _admin(
        "PUT",
        "/api/policies/{capability}",
        "Write a policy (relayed to the registry)",
        {200: Policy},
        request=Policy,
        errors=UPSTREAM_ERRORS,
        parameters=(header("If-Match", "The ETag the write is based on"), header("If-None-Match", "* : create only")),
    ),
    _admin(
        "DELETE",
        "/api/policies/{capability}",
        "Delete a policy (relayed to the registry)",
        {200: PolicyDeleted},
        errors=UPSTREAM_ERRORS,
    ),
    _admin(
        "GET",
        "/api/rules/stats",
        "The router's rule statistics",
        {200: RuleStats},
        errors=(502,),
        parameters=(query("capability", "Only this capability's"),),
    ),
    _admin("GET", "/api/scores/{capability}", "The router's instance scores", {200: Scores}, errors=(404, 502)),
    _admin("GET", "/api/cluster", "The registry's cluster", {200: ClusterView}, errors=(502,)),
    _admin("GET", "/api/clients", "Every client and its account", {200: Clients}, errors=(502,)),
    _admin(
        "PUT",
        "/api/clients/{client_id}/budget",
        "Replace a client's budget (relayed to the registry)",
        {200: ClientView},
        request=ClientBudget,
        errors=UPSTREAM_ERRORS,
    ),
    _admin("GET", "/api/examples", "Learned phrasings per capability", {200: list[ExampleSummary]}, errors=(502,)),
    *(
        _relayed(
            method,
            "/api/examples/{tail}",
            f"{method} the registry's /examples/{{tail}}",
            request=RELAYED if method in ("POST", "PUT") else None,
            request_required=False,
        )
        for method in ("GET", "POST", "PUT", "DELETE")
    ),
    _admin("GET", "/api/quality", "Quality scores under their floor", {200: QualityAlerts}, errors=(502,)),
    *(
        _relayed(
            method,
            "/api/quality/{tail}",
            f"{method} the registry's /quality/{{tail}}",
            request=RELAYED if method == "PUT" else None,
            request_required=False,
        )
        for method in ("GET", "PUT", "DELETE")
    ),
    _admin("GET", "/api/alerts", "The router's alerts", {200: AlertsAnswer}, errors=(502,)),
    _admin("GET", "/api/settings/alerts", "The alerts' thresholds", {200: AlertConfig}, errors=(502,)),
    _admin(
        "PUT",
        "/api/settings/alerts",
        "Set the alerts' thresholds (relayed to the registry)",
        {200: AlertConfig},
        request=AlertConfig,
        errors=UPSTREAM_ERRORS,
    ),
    _admin(
        "POST",
        "/api/debug",
        "Send a frame to the router as written and report what came back",
        {200: DebugResult},
        request=(RequestFrame, Body("Any bytes: sent as written", schema={})),
        errors=(502,),
        parameters=(
            header("X-Reach-Caller-Key", "The API key to call as"),
            query("as", "debug-client: call as the console's own client", {"type": "string", "enum": ["debug-client"]}),
        ),
    ),
]


@functools.cache
def console_document() -> dict[str, Any]:
    """Built once per process: every console serves the same one."""
    return document(
        "Agent Reach console",
        "The operators' dashboard's JSON API. Errors answer "
        "{error, message, field}; relayed ones as the registry or the router answered them.",
        OPERATIONS,
        SECURITY_SCHEMES,
    )
