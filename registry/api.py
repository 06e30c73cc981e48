"""The registry's HTTP API: JSON in, JSON out, every failure a 4xx/5xx body naming code and field.

Handlers read the registry's parts from the app (typed AppKeys); the route table at the bottom says
which endpoints exist and which are the operators' (the admin key).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from agent_reach.admission import Gate as ConnectionGate
from agent_reach.connections import error_body
from agent_reach.registration import AgentRef, CapabilityRef, HeartbeatRequest, Name, RegisterRequest
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from auth.records import ClientBudget, ClientCreate, PublishedKey, TokenCreate, client_view
from mesh.alerts import AlertConfig
from mesh.budgets import LeaseRequest
from mesh.examples import Confirmation, ExampleSettings, NewExample, Rejection
from mesh.intent_rules import IntentRule
from mesh.policy import Policy
from mesh.policy_writes import ANY_POLICY, PolicyChanged, policy_etag
from mesh.quality import QualityPost
from mesh.watch import ROUTER_ID_MAX, encode_event, valid_router_id
from registry.access import Access, admin_key_path
from registry.budgets import MAX_ACCOUNTS_LISTED
from registry.cluster import Membership, SoleNode
from registry.examples import Examples
from registry.gate import Gate
from registry.gossip import SIGNATURE_HEADER
from registry.health import HealthChecker
from registry.metrics import metrics_registry, render
from registry.openapi import registry_document
from registry.quality import Quality
from registry.service import Registry
from registry.watch import WatchHub
from wal import WalUnavailable
from weblayer import openapi
from weblayer.errors import ApiError
from weblayer.guard import admin_only
from weblayer.middleware import errors_as_json
from weblayer.reading import bounded_int, converted, read_json, whole_number
from weblayer.responses import json_response

log = logging.getLogger("agentreach.registry.api")

DEFAULT_MAX_BODY = 1024 * 1024
REGISTRY_KEY = web.AppKey("registry", Registry)
GATE_KEY = web.AppKey("gate", Gate)
METRICS_KEY = web.AppKey("metrics", CollectorRegistry)
# Set only when the registry has a watch feed / keeps admin.key where the API may rotate it.
HUB_KEY = web.AppKey("hub", WatchHub)
DATA_DIR_KEY = web.AppKey("data_dir", Path)
# On every answer of a node that cannot reach etcd: seconds since its view was last known current.
STALE_HEADER = "X-AgentReach-View-Stale"
CLUSTER_KEY = web.AppKey("cluster", Membership)
# A revision is a 64-bit count: at most 19 digits.
REVISION_DIGITS = 19


def storage_outage(exc: Exception) -> ApiError | None:
    """Nothing was acknowledged. With the WAL the change is not in the log or in memory; with etcd it may still
    commit later (etcd executes what it received after the registry gave up): an unknown outcome. Retry once
    /healthz is ok."""
    if isinstance(exc, WalUnavailable):
        return ApiError(503, "storage_unavailable", f"The registry cannot store changes now: {exc}")
    return None


registry_errors = errors_as_json("registry", log, storage_outage)


def since_revision(request: web.Request) -> int | None:
    raw = request.query.get("since")
    if raw is None:
        return None
    revision = whole_number(raw, REVISION_DIGITS)
    if revision is None:
        raise ApiError(400, "invalid_field", f"since must be a revision number, got {raw[:40]!r}", "since")
    return revision


def announced_router(request: web.Request) -> str | None:
    """`?router=ID`: the follower is a router, counted in every router's share of the limits."""
    router_id = request.query.get("router")
    if router_id is not None and not valid_router_id(router_id):
        raise ApiError(400, "invalid_field", f"router must be the router's id: 1-{ROUTER_ID_MAX} visible ASCII "
                       "characters", "router")
    return router_id


def access(request: web.Request) -> Access:
    """Clients, tokens and keys: the registry's credentials (registry/access.py)."""
    return request.app[REGISTRY_KEY].access


def path_capability(request: web.Request) -> str:
    """A capability name taken from the URL path, held to the same rules as in a body."""
    return converted(request.match_info["capability"], Name, "capability")


# Agents (registration token), checked by the handlers themselves.

async def register(request: web.Request) -> web.Response:
    token = request.app[GATE_KEY].agent(request.headers)
    return json_response(await request.app[REGISTRY_KEY].register(await read_json(request, RegisterRequest), token))


async def heartbeat(request: web.Request) -> web.Response:
    token = request.app[GATE_KEY].agent(request.headers)
    beat = await read_json(request, HeartbeatRequest)
    return json_response({"agent_id": beat.agent_id, "state": request.app[REGISTRY_KEY].heartbeat(beat, token)})


async def deregister(request: web.Request) -> web.Response:
    token = request.app[GATE_KEY].agent(request.headers)
    ref = await read_json(request, AgentRef)
    await request.app[REGISTRY_KEY].deregister(ref.agent_id, token)
    return json_response({"agent_id": ref.agent_id, "deregistered": True})


async def query(request: web.Request) -> web.Response:
    request.app[GATE_KEY].reader(request.headers)
    capability = (await read_json(request, CapabilityRef)).capability
    return json_response(request.app[REGISTRY_KEY].query(capability))


# Open: health probes and scrapers.

async def healthz(request: web.Request) -> web.Response:
    store = request.app[REGISTRY_KEY].store
    storage = store.health
    if not storage.writable:
        problem = error_body("storage_unavailable", f"The registry cannot store changes: {storage.problem}")
        return json_response({"status": "unavailable", **problem, "since": storage.since, "revision": store.revision},
                             503)
    stale = request.app[CLUSTER_KEY].stale_seconds()
    if stale is not None:
        problem = error_body("view_stale", f"This registry node has not reached etcd for {stale:.1f}s: what it "
                             "knows may be out of date; ask another node")
        return json_response({"status": "stale", **problem, "stale_seconds": stale, "revision": store.revision}, 503)
    return json_response({"status": "ok", "revision": store.revision})


async def gossip(request: web.Request) -> web.Response:
    """Soft state from another registry node, signed with the cluster's node key (registry/gossip.py)."""
    request.app[CLUSTER_KEY].hear(await request.read(), request.headers.get(SIGNATURE_HEADER))
    return web.Response(status=204)


@web.middleware
async def stale_view_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer from a node cut off from etcd says how stale its view may be."""
    response = await handler(request)
    stale = request.app[CLUSTER_KEY].stale_seconds()
    if stale is not None and not response.prepared:
        response.headers[STALE_HEADER] = f"{stale:.1f}"
    return response


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=render(request.app[METRICS_KEY]))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


# Operators (the admin key).

async def agents(request: web.Request) -> web.Response:
    return json_response({"agents": request.app[REGISTRY_KEY].agents()})


async def agent(request: web.Request) -> web.Response:
    return json_response(request.app[REGISTRY_KEY].agent(request.match_info["agent_id"]))


async def policies(request: web.Request) -> web.Response:
    return json_response({"policies": list(request.app[REGISTRY_KEY].state.policies.values())})


_ETAG = re.compile(r'"([^"]*)"')


def etag(policy: Policy) -> dict[str, str]:
    """What a conditional write names as the policy it was based on (``If-Match``)."""
    return {"ETag": policy_etag(policy)}


def if_match(request: web.Request) -> str | None:
    """The one ETag a conditional write was based on (ANY_POLICY for ``*``); None: the write is unconditional."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    if raw.strip() == "*":
        return ANY_POLICY
    matched = _ETAG.fullmatch(raw.strip())
    if matched is None:
        raise ApiError(400, "invalid_field", "If-Match must be one ETag as GET /policies/{capability} answers it, "
                       f'quotes included ("..."), got {raw!r}', "If-Match")
    return matched.group(1)


def if_none_match(request: web.Request) -> bool:
    """``If-None-Match: *``: the write creates the policy, never writes over one (the only form a write takes)."""
    raw = request.headers.get("If-None-Match")
    if raw is not None and raw.strip() != "*":
        raise ApiError(400, "invalid_field", f"If-None-Match on a write must be * (create only), got {raw!r}",
                       "If-None-Match")
    return raw is not None


async def get_policy(request: web.Request) -> web.Response:
    policy = request.app[REGISTRY_KEY].policy(path_capability(request))
    return json_response(policy, headers=etag(policy))


async def put_policy(request: web.Request) -> web.Response:
    """With ``If-Match``: written only over the policy it names (``*``: any), with ``If-None-Match: *`` only where
    none is stored; else 409 with the policy stored now."""
    capability = path_capability(request)
    based_on, absent = if_match(request), if_none_match(request)
    try:
        stored = await request.app[REGISTRY_KEY].put_policy(capability, await read_json(request, Policy), based_on,
                                                            absent)
    except PolicyChanged as exc:
        raise ApiError(409, "policy_exists" if exc.exists else "policy_changed", str(exc),
                       "If-None-Match" if exc.exists else "If-Match", policy=exc.current) from None
    return json_response(stored, headers=etag(stored))


async def delete_policy(request: web.Request) -> web.Response:
    capability = path_capability(request)
    await request.app[REGISTRY_KEY].delete_policy(capability)
    return json_response({"capability": capability, "deleted": True})


def examples(request: web.Request) -> Examples:
    """Learned phrasings of capabilities (registry/examples.py)."""
    return request.app[REGISTRY_KEY].examples


def example_ref(request: web.Request) -> tuple[str, str]:
    return path_capability(request), request.match_info["example_id"]


async def example_summary(request: web.Request) -> web.Response:
    return json_response(examples(request).summary())


async def list_examples(request: web.Request) -> web.Response:
    return json_response(examples(request).list(path_capability(request)))


async def add_example(request: web.Request) -> web.Response:
    capability = path_capability(request)
    return json_response(await examples(request).add(capability, (await read_json(request, NewExample)).text), 201)


async def confirm_example(request: web.Request) -> web.Response:
    """A router reports a caller's confirmed intent (semantic/confirmations.py)."""
    capability = path_capability(request)
    view = await examples(request).confirm(capability, await read_json(request, Confirmation))
    return json_response(view) if view is not None else web.Response(status=204)


async def accept_example(request: web.Request) -> web.Response:
    return json_response(await examples(request).accept(*example_ref(request)))


async def reject_example(request: web.Request) -> web.Response:
    capability, identifier = example_ref(request)
    rejection = await read_json(request, Rejection) if request.can_read_body else Rejection()
    return json_response(await examples(request).reject(capability, identifier, rejection.reason))


async def delete_example(request: web.Request) -> web.Response:
    capability, identifier = example_ref(request)
    await examples(request).delete(capability, identifier)
    return json_response({"capability": capability, "id": identifier, "deleted": True})


async def get_example_settings(request: web.Request) -> web.Response:
    return json_response(examples(request).settings(path_capability(request)))


async def put_example_settings(request: web.Request) -> web.Response:
    capability = path_capability(request)
    return json_response(await examples(request).put_settings(capability, await read_json(request, ExampleSettings)))


def quality(request: web.Request) -> Quality:
    """Operators' quality scores per instance (registry/quality.py)."""
    return request.app[REGISTRY_KEY].quality


def quality_ref(request: web.Request) -> tuple[str, str]:
    return path_capability(request), converted(request.match_info["agent_id"], Name, "agent_id")


async def quality_alerts(request: web.Request) -> web.Response:
    return json_response({"alerts": quality(request).alerts()})


async def list_quality(request: web.Request) -> web.Response:
    return json_response(quality(request).scores(path_capability(request)))


async def put_quality(request: web.Request) -> web.Response:
    capability, agent_id = quality_ref(request)
    return json_response(await quality(request).put(capability, agent_id, await read_json(request, QualityPost)))


async def delete_quality(request: web.Request) -> web.Response:
    capability, agent_id = quality_ref(request)
    await quality(request).delete(capability, agent_id)
    return json_response({"capability": capability, "agent_id": agent_id, "deleted": True})


def path_model(request: web.Request) -> str:
    """An embedding model's name from the URL path (its directory's name), held to the capability name rules."""
    return converted(request.match_info["model"], Name, "model")


async def intent_rules(request: web.Request) -> web.Response:
    return json_response(request.app[REGISTRY_KEY].state.keys.intent_rules)


async def get_intent_rule(request: web.Request) -> web.Response:
    return json_response(request.app[REGISTRY_KEY].intent_rule(path_model(request)))


async def put_intent_rule(request: web.Request) -> web.Response:
    """What `agentreach intents calibrate` fitted for a model: every router running that model routes with it."""
    rule = await read_json(request, IntentRule)
    return json_response(await request.app[REGISTRY_KEY].put_intent_rule(path_model(request), rule))


async def delete_intent_rule(request: web.Request) -> web.Response:
    model = path_model(request)
    await request.app[REGISTRY_KEY].delete_intent_rule(model)
    return json_response({"model": model, "deleted": True})


async def get_alert_settings(request: web.Request) -> web.Response:
    return json_response(request.app[REGISTRY_KEY].state.alerts)


async def put_alert_settings(request: web.Request) -> web.Response:
    settings = await read_json(request, AlertConfig)
    return json_response(await request.app[REGISTRY_KEY].put_alert_settings(settings))


async def watch(request: web.Request) -> web.StreamResponse:
    hub = request.app.get(HUB_KEY)
    if hub is None:
        raise ApiError(404, "not_found", "This registry has no watch feed")
    stale = request.app[CLUSTER_KEY].stale_seconds()
    if stale is not None:
        raise ApiError(503, "view_stale", f"This registry node has not reached etcd for {stale:.1f}s; follow "
                       "another node")
    since, router_id = since_revision(request), announced_router(request)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    subscription = hub.subscribe(since, router_id)
    try:
        async for event in subscription:
            await response.write(encode_event(event))
    except ConnectionResetError:
        log.info("watch follower went away; it resumes by revision when it returns")
    finally:
        # At once, not when the stream is collected: a router counts toward the limit shares until then.
        subscription.end()
    return response


async def cluster(request: web.Request) -> web.Response:
    return json_response(await request.app[CLUSTER_KEY].view())


async def create_client(request: web.Request) -> web.Response:
    return json_response(await access(request).create_client(await read_json(request, ClientCreate)), 201)


async def clients(request: web.Request) -> web.Response:
    return json_response({"clients": access(request).clients()})


async def client(request: web.Request) -> web.Response:
    return json_response(client_view(await access(request).known_client(request.match_info["client_id"])))


async def disable_client(request: web.Request) -> web.Response:
    return json_response(await access(request).set_enabled(request.match_info["client_id"], False))


async def enable_client(request: web.Request) -> web.Response:
    return json_response(await access(request).set_enabled(request.match_info["client_id"], True))


async def rotate_client(request: web.Request) -> web.Response:
    return json_response(await access(request).rotate(request.match_info["client_id"]))


async def set_budget(request: web.Request) -> web.Response:
    budget = await read_json(request, ClientBudget)
    return json_response(await access(request).set_budget(request.match_info["client_id"], budget))


async def budget(request: web.Request) -> web.Response:
    return json_response(request.app[REGISTRY_KEY].budgets.account(request.match_info["client_id"]))


async def budgets(request: web.Request) -> web.Response:
    """Every budgeted client's account, a page of ``limit`` in client id order after ``after``."""
    limit = bounded_int(request, "limit", MAX_ACCOUNTS_LISTED, 1, MAX_ACCOUNTS_LISTED)
    return json_response(request.app[REGISTRY_KEY].budgets.accounts(request.query.get("after", ""), limit))


async def lease_budget(request: web.Request) -> web.Response:
    """A router's spend so far and its next chunk of the client's budget (registry/budgets.py)."""
    ask = await read_json(request, LeaseRequest)
    return json_response(await request.app[REGISTRY_KEY].budgets.lease(request.match_info["client_id"], ask))


async def create_token(request: web.Request) -> web.Response:
    return json_response(await access(request).create_token(await read_json(request, TokenCreate)), 201)


async def tokens(request: web.Request) -> web.Response:
    return json_response({"tokens": access(request).tokens()})


async def revoke_token(request: web.Request) -> web.Response:
    return json_response(await request.app[REGISTRY_KEY].revoke_token(request.match_info["token_id"]))


async def published_keys(request: web.Request) -> web.Response:
    return json_response({"keys": list(request.app[REGISTRY_KEY].state.auth.published_keys.values())})


async def publish_keys(request: web.Request) -> web.Response:
    """PUT /signing-keys: a router's verifying keys (a JSON list), so other routers accept its tokens."""
    keys = await read_json(request, list[PublishedKey])
    await access(request).publish_keys(keys)
    return json_response({"keys": keys})


async def rotate_admin_key(request: web.Request) -> web.Response:
    data_dir = request.app[DATA_DIR_KEY]
    key = await access(request).rotate_admin_key(data_dir)
    return json_response({"admin_key": key, "stored_in": str(admin_key_path(data_dir))})


OPEN: list[tuple[str, str, Handler]] = [
    ("POST", "/register", register), ("POST", "/heartbeat", heartbeat), ("POST", "/deregister", deregister),
    ("POST", "/query", query), ("GET", "/healthz", healthz), ("GET", "/metrics", metrics),
    ("POST", "/cluster/gossip", gossip)]
ADMIN_ONLY: list[tuple[str, str, Handler]] = [
    ("GET", "/agents", agents), ("GET", "/agents/{agent_id}", agent),
    ("GET", "/policies", policies), ("GET", "/policies/{capability}", get_policy),
    ("PUT", "/policies/{capability}", put_policy), ("DELETE", "/policies/{capability}", delete_policy),
    ("GET", "/settings/alerts", get_alert_settings), ("PUT", "/settings/alerts", put_alert_settings),
    ("GET", "/intent-rules", intent_rules), ("GET", "/intent-rules/{model}", get_intent_rule),
    ("PUT", "/intent-rules/{model}", put_intent_rule), ("DELETE", "/intent-rules/{model}", delete_intent_rule),
    ("GET", "/examples", example_summary),
    ("GET", "/examples/{capability}", list_examples), ("POST", "/examples/{capability}", add_example),
    ("POST", "/examples/{capability}/confirmations", confirm_example),
    ("GET", "/examples/{capability}/settings", get_example_settings),
    ("PUT", "/examples/{capability}/settings", put_example_settings),
    ("POST", "/examples/{capability}/{example_id}/accept", accept_example),
    ("POST", "/examples/{capability}/{example_id}/reject", reject_example),
    ("DELETE", "/examples/{capability}/{example_id}", delete_example),
    ("GET", "/quality", quality_alerts), ("GET", "/quality/{capability}", list_quality),
    ("PUT", "/quality/{capability}/{agent_id}", put_quality),
    ("DELETE", "/quality/{capability}/{agent_id}", delete_quality),
    ("GET", "/watch", watch), ("GET", "/cluster", cluster),
    ("POST", "/clients", create_client), ("GET", "/clients", clients), ("GET", "/clients/{client_id}", client),
    ("POST", "/clients/{client_id}/disable", disable_client), ("POST", "/clients/{client_id}/enable", enable_client),
    ("POST", "/clients/{client_id}/rotate", rotate_client), ("PUT", "/clients/{client_id}/budget", set_budget),
    ("GET", "/budgets", budgets), ("GET", "/budgets/{client_id}", budget),
    ("POST", "/budgets/{client_id}/lease", lease_budget),
    ("POST", "/tokens", create_token), ("GET", "/tokens", tokens), ("POST", "/tokens/{token_id}/revoke", revoke_token),
    ("GET", "/signing-keys", published_keys), ("PUT", "/signing-keys", publish_keys)]
# Only with auth on and a data dir to write the new key to.
ROTATE_ADMIN_KEY: tuple[str, str, Handler] = ("POST", "/admin-key/rotate", rotate_admin_key)


def create_app(registry: Registry, checker: HealthChecker | None = None, hub: WatchHub | None = None, *,
               max_body: int = DEFAULT_MAX_BODY, auth: bool = True, data_dir: Path | None = None,
               membership: Membership | None = None, connections: ConnectionGate | None = None) -> web.Application:
    """``data_dir`` (where admin.key lives) enables rotating the admin key over the API; ``connections``, the
    listener's, is shown in /metrics."""
    app = web.Application(middlewares=[stale_view_header, registry_errors], client_max_size=max_body)
    gate = Gate(registry.state.auth, auth)
    app[REGISTRY_KEY] = registry
    app[CLUSTER_KEY] = membership if membership is not None else SoleNode(registry, hub, url="")
    app[GATE_KEY] = gate
    app[METRICS_KEY] = metrics_registry(registry, checker, app[CLUSTER_KEY], connections)
    if hub is not None:
        app[HUB_KEY] = hub
    admin_routes = ADMIN_ONLY
    if auth and data_dir is not None:
        app[DATA_DIR_KEY] = data_dir
        admin_routes = [*ADMIN_ONLY, ROTATE_ADMIN_KEY]
    for method, path, handler in OPEN:
        app.router.add_route(method, path, handler)
    for method, path, handler in admin_routes:
        app.router.add_route(method, path, admin_only(handler, gate.admin_refusal))
    spec = registry_document(ROTATE_ADMIN_KEY in admin_routes)
    app.router.add_route("GET", openapi.OPENAPI_JSON, openapi.handler(spec))
    return app
