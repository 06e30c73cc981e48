"""The console's JSON API (everything the front end reads or changes) and its static files.

Reads of live state come from the collector's last poll; changes (policies, alert thresholds)
and the debug entry go straight through to the registry or the router, whose answers, errors
included, are relayed unchanged so a validation error's ``field`` reaches the form. With auth on,
everything under /api/ but the sign-in endpoints needs a signed-in operator (console/signin.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
from agent_reach import peer_json
from agent_reach.admission import Gate
from agent_reach.headers import API_KEY_HEADER, REQUEST_ID_HEADER, ROUTE_HEADERS
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST

from console.collector import Collector
from console.debug_callers import DebugCallers, DebugKey
from console.hub import Hub
from console.metrics import render
from console.models import AgentDetail, ConsoleConfig, DebugResult, PolicyEntry, ReachView, RoutesView, TrafficStat
from console.openapi import console_document
from console.rollup import capability_reach
from console.signin import Gatekeeper
from console.store import HOUR, ConsoleStore
from console.upstream import Reply, Upstream
from mesh.policy import DEFAULT_POLICY, Policy
from mesh.policy_writes import policy_etag
from registry.views import AgentView
from router.inspection import MAX_TRACES_LISTED
from weblayer import openapi
from weblayer.errors import ApiError
from weblayer.middleware import errors_as_json
from weblayer.reading import bounded_int
from weblayer.responses import json_response

log = logging.getLogger("agentreach.console.api")

STATIC = Path(__file__).parent / "static"
MAX_BODY = 16 * 1024 * 1024
TOPICS = frozenset({"overview", "agents"})
CALLER_KEY_HEADER = "X-Reach-Caller-Key"
# How long a debug call made with a just-minted client waits for the router to learn that client.
NEW_CLIENT_WAIT = 5.0


class NamedCapability(msgspec.Struct):
    capability: str | None = None


_named = peer_json.Decoder(NamedCapability)
console_errors = errors_as_json("console", log)


def named_capability(frame: bytes) -> str | None:
    """The capability a frame names, if it is a JSON object that names one."""
    try:
        return _named.decode(frame).capability
    except msgspec.MsgspecError:
        return None


def relay(reply: Reply) -> web.Response:
    """The upstream's answer as it came, status and body."""
    return web.Response(body=reply.body, status=reply.status, content_type="application/json")


def segment(value: str) -> str:
    """A path parameter passed on upstream as exactly one path segment, whatever it contains."""
    return quote(value, safe="")


def callers_in(node: dict[str, Any]) -> set[str]:
    """The caller (client) ids in a trace tree."""
    found = {node["call"]["caller"]} if node["call"].get("caller") else set()
    for child in node["children"]:
        found |= callers_in(child)
    return found


def hours_since(request: web.Request, now: float) -> float:
    return now - bounded_int(request, "hours", 24, 1, 24 * 7) * HOUR


async def revalidate_static(request: web.Request, response: web.StreamResponse) -> None:
    """Browsers must ask again (a cheap 304) so an upgraded console never runs yesterday's modules."""
    if request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-cache"


@dataclasses.dataclass(eq=False)  # compared and hashed by identity, like any handler owner
class ConsoleApi:
    """The handlers, sharing the collector (live state), the store (hours) and the upstreams."""

    config: ConsoleConfig
    collector: Collector
    store: ConsoleStore
    hub: Hub
    registry: Upstream
    router: Upstream
    connections: Gate
    gatekeeper: Gatekeeper
    debug_callers: DebugCallers = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.debug_callers = DebugCallers(self.registry)

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def healthz(self, request: web.Request) -> web.Response:
        """The console serves whether or not it can read the mesh; whether its last poll could is said
        per part, without the reasons (they name internal URLs; signed-in operators see them)."""
        parts = {part: {"ok": status.ok, "checked_at": status.checked_at}
                 for part, status in self.collector.statuses().items()}
        return json_response({"status": "ok", "polls": self.collector.polls, **parts})

    async def metrics(self, request: web.Request) -> web.Response:
        sessions = self.gatekeeper.sessions
        body = render(self.collector, self.hub, sessions.count if sessions is not None else lambda: 0,
                      self.connections)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_config(self, request: web.Request) -> web.Response:
        return json_response(self.config)

    async def overview(self, request: web.Request) -> web.Response:
        return json_response(self.collector.overview(time.time()))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        topics = frozenset(request.query.get("topics", "overview").split(","))
        if not topics or not topics <= TOPICS:
            raise ApiError(400, "invalid_field", f"topics must be among {sorted(TOPICS)}", "topics")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        await response.write(f"retry: {int(self.config.poll_interval * 2000)}\n\n".encode())
        try:
            async for event in self.hub.subscribe(topics):
                await response.write(b": keepalive\n\n" if event is None else event.encode())
        except ConnectionResetError:
            pass  # the browser left: its page closed or navigated away
        return response

    async def agents(self, request: web.Request) -> web.Response:
        return json_response({"agents": self.collector.agent_rows(time.time())})

    async def agent(self, request: web.Request) -> web.Response:
        agent_id = request.match_info["agent_id"]
        reply = await self.registry.get(f"/agents/{segment(agent_id)}")
        if not reply.ok:
            return relay(reply)
        now = time.time()
        heartbeats, traffic = self.collector.heartbeats, self.collector.traffic
        return json_response(AgentDetail(
            agent=peer_json.decode(reply.body, type=AgentView), heartbeats=heartbeats.beats(agent_id),
            transitions=heartbeats.transitions(agent_id),
            traffic=traffic.by_agent(now).get(agent_id) or TrafficStat(),
            capabilities=traffic.by_capability(agent_id, now),
            hours=await self.store.agent_hours(agent_id, hours_since(request, now))))

    async def reach(self, request: web.Request) -> web.Response:
        now = time.time()
        reach = self.collector.reach
        alerting = {alert.capability for alert in self.collector.alerts if alert.state == "active"}
        return json_response(ReachView(
            period_seconds=reach.period_seconds, points=self.collector.curve(now),
            capabilities=capability_reach(reach.periods, alerting), instance_health_rate=reach.instance_health_rate,
            hours=await self.store.reach_hours(hours_since(request, now))))

    async def routes(self, request: web.Request) -> web.Response:
        now = time.time()
        return json_response(RoutesView(decisions=dict(self.collector.reach.route_decisions),
                                        hours=await self.store.decision_hours(hours_since(request, now))))

    async def traces(self, request: web.Request) -> web.Response:
        """A page of the router's recent calls, newest first: ``limit`` of them after the first ``offset``."""
        limit = bounded_int(request, "limit", 50, 1, MAX_TRACES_LISTED)
        offset = bounded_int(request, "offset", 0, 0, MAX_TRACES_LISTED - 1)
        params = {"limit": str(min(MAX_TRACES_LISTED, offset + limit + 1))}
        if request.query.get("capability"):
            params["capability"] = request.query["capability"]
        reply = await self.router.get("/traces", params)
        if not reply.ok:
            return relay(reply)
        traces = reply.json()["traces"]
        return json_response({"traces": traces[offset:offset + limit], "offset": offset,
                              "more": len(traces) > offset + limit})

    async def trace(self, request: web.Request) -> web.Response:
        """The router's trace, and the names of the clients who made its calls (it knows their ids)."""
        reply = await self.router.get(f"/traces/{segment(request.match_info['request_id'])}")
        if not reply.ok:
            return relay(reply)
        answer = reply.json()
        callers = callers_in(answer["tree"])
        clients = await self.registry.get("/clients") if callers else None
        answer["caller_names"] = {client["client_id"]: client["name"] for client in clients.json()["clients"]
                                  if client["client_id"] in callers} if clients is not None and clients.ok else {}
        return json_response(answer)

    async def policies(self, request: web.Request) -> web.Response:
        reply = await self.registry.get("/policies")
        if not reply.ok:
            return relay(reply)
        stored = {policy["capability"]: policy for policy in reply.json()["policies"]}
        owners = self.collector.owners()
        default = msgspec.to_builtins(DEFAULT_POLICY)
        entries = [PolicyEntry(capability=name, service=owners.get(name), stored=name in stored,
                               policy=stored.get(name) or {**default, "capability": name},
                               etag=policy_etag(msgspec.convert(stored[name], Policy)) if name in stored else None)
                   for name in sorted(owners.keys() | stored.keys())]
        return json_response({"policies": entries})

    async def rule_stats(self, request: web.Request) -> web.Response:
        """Hits per live rule, shadow rules' agreement and mirrored copies, as the router counts them."""
        capability = request.query.get("capability")
        return relay(await self.router.get("/rules/stats", {"capability": capability} if capability else None))

    async def put_policy(self, request: web.Request) -> web.Response:
        """The editor's ``If-Match`` (or ``If-None-Match: *`` creating one) passed on and the registry's ``ETag``
        passed back: the editor saves only over the policy it opened (or last saved), and a policy changed (or
        created) meanwhile is refused 409 ``policy_changed`` (``policy_exists``)."""
        conditions = {name: request.headers[name] for name in ("If-Match", "If-None-Match") if name in request.headers}
        reply = await self.registry.request("PUT", f"/policies/{segment(request.match_info['capability'])}",
                                            await request.read(), conditions=conditions or None)
        response = relay(reply)
        etag = CIMultiDict(reply.headers).get("ETag")
        if etag is not None:
            response.headers["ETag"] = etag
        return response

    async def delete_policy(self, request: web.Request) -> web.Response:
        return relay(await self.registry.request("DELETE", f"/policies/{segment(request.match_info['capability'])}"))

    async def examples(self, request: web.Request) -> web.Response:
        """Learned examples: the request relayed to the registry's /examples as it came (registry/examples.py)."""
        return await self.relayed(request, "/examples")

    async def quality(self, request: web.Request) -> web.Response:
        """Quality scores and their alerts: relayed to the registry's /quality as it came (registry/quality.py)."""
        return await self.relayed(request, "/quality")

    async def relayed(self, request: web.Request, root: str) -> web.Response:
        """The request relayed to the registry under ``root``, each part of the path's tail one segment."""
        parts = [segment(part) for part in request.match_info.get("tail", "").split("/") if part]
        if {".", ".."} & set(parts):
            raise ApiError(404, "not_found", f"No such {root[1:]} path", None)
        body = await request.read() if request.can_read_body else None
        return relay(await self.registry.request(request.method, "/".join([root, *parts]), body))

    async def scores(self, request: web.Request) -> web.Response:
        """Every instance's score under the scored policy, as the router sees it (router/scoring.py)."""
        return relay(await self.router.get(f"/scores/{segment(request.match_info['capability'])}"))

    async def clients(self, request: web.Request) -> web.Response:
        """The registry's clients (never a secret), each with its account for the period when it has a budget
        (spend, what is committed, the reset time), null when it has none or the accounts were unreadable."""
        reply, by_id = await asyncio.gather(self.registry.get("/clients"), self.accounts())
        if not reply.ok:
            return relay(reply)
        return json_response({"clients": [{**client, "account": by_id.get(client["client_id"])}
                                          for client in reply.json()["clients"]]})

    async def accounts(self) -> dict[str, Any]:
        """Every budgeted client's account by client id, from the registry's GET /budgets: one read, or one
        per page of its largest page beyond that; none when a page is unreadable."""
        found: dict[str, Any] = {}
        after: str | None = ""
        while after is not None:
            reply = await self.registry.get("/budgets", {"after": after} if after else None)
            if not reply.ok:
                return {}
            page = reply.json()
            found.update((account["client_id"], account) for account in page["budgets"])
            after = page["next_after"]
        return found

    async def put_budget(self, request: web.Request) -> web.Response:
        """A client's budget set or cleared: relayed to the registry's PUT /clients/{client_id}/budget."""
        return relay(await self.registry.request("PUT", f"/clients/{segment(request.match_info['client_id'])}/budget",
                                                 await request.read()))

    async def cluster(self, request: web.Request) -> web.Response:
        """The registry's /cluster as the first registry that answers sees it (the console sends its admin key)."""
        return relay(await self.registry.get("/cluster"))

    async def alerts(self, request: web.Request) -> web.Response:
        return relay(await self.router.get("/alerts"))

    async def alert_settings(self, request: web.Request) -> web.Response:
        return relay(await self.registry.get("/settings/alerts"))

    async def put_alert_settings(self, request: web.Request) -> web.Response:
        return relay(await self.registry.request("PUT", "/settings/alerts", await request.read()))

    async def send_frame(self, frame: bytes, caller_key: str | None) -> Reply:
        # The debug page shows everything the router can say, the X-Reach-* route headers included.
        headers = {ROUTE_HEADERS: "on", **({API_KEY_HEADER: caller_key} if caller_key else {})}
        return await self.router.request("POST", "/atp", frame, headers=headers)

    async def debug_key(self, capability: str) -> DebugKey:
        key = await self.debug_callers.key_for(capability)
        if isinstance(key, Reply):
            raise ApiError(502, "upstream_error", f"The registry did not give the console its debug client: "
                           f"{key.error()}", None)
        return key

    async def send_as_debug_client(self, frame: bytes) -> Reply:
        """Send as the console's own client for the frame's capability (console/debug_callers.py)."""
        capability = named_capability(frame)
        if capability is None or capability not in self.collector.owners():
            raise ApiError(400, "invalid_field", "Calling as the console's debug client needs the frame to name "
                           "a capability some instance offers", "capability")
        key = await self.debug_key(capability)
        reply = await self.send_frame(frame, key.api_key)
        if reply.status == 401 and not key.fresh:
            self.debug_callers.forget(capability, key.api_key)
            key = await self.debug_key(capability)
            reply = await self.send_frame(frame, key.api_key)
        deadline = time.monotonic() + NEW_CLIENT_WAIT
        while key.fresh and reply.status == 401 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the router learns of new clients from the registry's feed
            reply = await self.send_frame(frame, key.api_key)
        return reply

    async def debug(self, request: web.Request) -> web.Response:
        """Send the body to the router's /atp exactly as written, as the caller whose API key came
        in X-Reach-Caller-Key or, with ``?as=debug-client``, as the console's own client (never as
        the admin), and report what came back."""
        sent = await request.read()
        if request.query.get("as") == "debug-client":
            reply = await self.send_as_debug_client(sent)
        else:
            reply = await self.send_frame(sent, request.headers.get(CALLER_KEY_HEADER))
        try:
            frame = reply.json()
        except msgspec.DecodeError:
            frame = reply.body.decode(errors="replace")
        request_id_header = REQUEST_ID_HEADER.lower()
        headers = {name.lower(): value for name, value in reply.headers.items()
                   if name.lower().startswith("x-reach-") or name.lower() == request_id_header}
        request_id = headers.get(request_id_header) or (frame.get("request_id") if isinstance(frame, dict) else None)
        return json_response(DebugResult(
            http_status=reply.status, request_id=request_id, elapsed_ms=round(reply.elapsed_ms, 3), headers=headers,
            frame=frame, trace_url=f"/api/traces/{request_id}" if request_id else None))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[console_errors, self.gatekeeper.guard], client_max_size=MAX_BODY)
        app.on_response_prepare.append(revalidate_static)
        self.gatekeeper.add_routes(app)
        routes = app.router
        routes.add_get("/", self.index)
        routes.add_get("/healthz", self.healthz)
        routes.add_get("/metrics", self.metrics)
        routes.add_route("GET", openapi.OPENAPI_JSON, openapi.handler(console_document()))
        routes.add_static("/static", STATIC, append_version=False)
        routes.add_get("/api/config", self.get_config)
        routes.add_get("/api/overview", self.overview)
        routes.add_get("/api/stream", self.stream)
        routes.add_get("/api/agents", self.agents)
        routes.add_get("/api/agents/{agent_id}", self.agent)
        routes.add_get("/api/reach", self.reach)
        routes.add_get("/api/routes", self.routes)
        routes.add_get("/api/traces", self.traces)
        routes.add_get("/api/traces/{request_id}", self.trace)
        routes.add_get("/api/policies", self.policies)
        routes.add_put("/api/policies/{capability}", self.put_policy)
        routes.add_delete("/api/policies/{capability}", self.delete_policy)
        routes.add_get("/api/rules/stats", self.rule_stats)
        routes.add_get("/api/scores/{capability}", self.scores)
        routes.add_get("/api/cluster", self.cluster)
        routes.add_get("/api/clients", self.clients)
        routes.add_put("/api/clients/{client_id}/budget", self.put_budget)
        routes.add_get("/api/examples", self.examples)
        for method in ("GET", "POST", "PUT", "DELETE"):
            routes.add_route(method, "/api/examples/{tail:.+}", self.examples)
        routes.add_get("/api/quality", self.quality)
        for method in ("GET", "PUT", "DELETE"):
            routes.add_route(method, "/api/quality/{tail:.+}", self.quality)
        routes.add_get("/api/alerts", self.alerts)
        routes.add_get("/api/settings/alerts", self.alert_settings)
        routes.add_put("/api/settings/alerts", self.put_alert_settings)
        routes.add_post("/api/debug", self.debug)
        return app
