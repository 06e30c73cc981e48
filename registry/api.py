"""The registry's HTTP API: JSON in, JSON out, every failure a 4xx/5xx body naming code and field."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from agent_reach.connections import unreadable_body
from agent_reach.registration import AgentRef, CapabilityRef, HeartbeatRequest, Name, RegisterRequest
from aiohttp import web
from auth.records import ClientCreate, PublishedKey, TokenCreate, client_view
from mesh.alerts import AlertConfig
from mesh.policy import Policy
from mesh.watch import encode_event
from prometheus_client import CONTENT_TYPE_LATEST
from wal import WalUnavailable

from registry.access import admin_key_path
from registry.errors import RegistryError, from_decode_error
from registry.gate import Gate
from registry.health import HealthChecker
from registry.metrics import metrics_registry, render
from registry.service import Registry
from registry.watch import WatchHub

log = logging.getLogger("agentreach.registry.api")

DEFAULT_MAX_BODY = 1024 * 1024
REGISTRY_KEY = web.AppKey("registry", Registry)

_decoders = {t: msgspec.json.Decoder(t)
             for t in (RegisterRequest, HeartbeatRequest, AgentRef, CapabilityRef, Policy, AlertConfig, ClientCreate,
                       TokenCreate, list[PublishedKey])}
_encoder = msgspec.json.Encoder()


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json")


def error_response(error: RegistryError) -> web.Response:
    return json_response(error.body(), error.status)


async def decode(request: web.Request, kind: type) -> Any:
    body = await request.read()
    try:
        return _decoders[kind].decode(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


def path_name(request: web.Request, part: str) -> str:
    """A capability name taken from the URL path, held to the same rules as in a body."""
    try:
        return msgspec.convert(request.match_info[part], Name)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc, prefix=part) from None


def since_revision(request: web.Request) -> int | None:
    raw = request.query.get("since")
    if raw is None:
        return None
    if not raw.isdigit():
        raise RegistryError(400, "invalid_field", f"since must be a revision number, got {raw!r}", "since")
    return int(raw)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RegistryError as error:
        if error.status in (401, 403):
            # Who tried what without the right credential: the registry's side of the security record.
            log.warning("request refused", extra={"path": request.path, "method": request.method,
                                                  "error": error.code, "reason": error.message,
                                                  "remote": request.remote})
        return error_response(error)
    except WalUnavailable as exc:
        # Nothing was acknowledged: the change is not in the log or in memory; retry once /healthz is ok.
        return error_response(RegistryError(503, "storage_unavailable", f"The registry cannot store changes now: {exc}"))
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(RegistryError(413, "payload_too_large", exc.text or "Request body too large"))
    except web.RequestPayloadError as exc:
        status, body = unreadable_body(exc)
        return json_response(body, status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return error_response(RegistryError(exc.status, code, exc.reason))
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return error_response(RegistryError(500, "internal_error", "The registry failed to handle this request"))


def create_app(registry: Registry, checker: HealthChecker | None = None, hub: WatchHub | None = None, *,
               max_body: int = DEFAULT_MAX_BODY, auth: bool = True, data_dir: Path | None = None) -> web.Application:
    """``data_dir`` (where admin.key lives) enables rotating the admin key over the API."""
    prometheus = metrics_registry(registry, checker)
    gate = Gate(registry.state.auth, auth)
    access = registry.access

    async def register(request: web.Request) -> web.Response:
        token = gate.agent(request.headers)
        return json_response(await registry.register(await decode(request, RegisterRequest), token))

    async def heartbeat(request: web.Request) -> web.Response:
        token = gate.agent(request.headers)
        beat = await decode(request, HeartbeatRequest)
        return json_response({"agent_id": beat.agent_id, "state": registry.heartbeat(beat, token)})

    async def deregister(request: web.Request) -> web.Response:
        token = gate.agent(request.headers)
        ref = await decode(request, AgentRef)
        await registry.deregister(ref.agent_id, token)
        return json_response({"agent_id": ref.agent_id, "deregistered": True})

    async def query(request: web.Request) -> web.Response:
        gate.reader(request.headers)
        return json_response(registry.query((await decode(request, CapabilityRef)).capability))

    async def create_client(request: web.Request) -> web.Response:
        return json_response(await access.create_client(await decode(request, ClientCreate)), 201)

    async def clients(request: web.Request) -> web.Response:
        return json_response({"clients": access.clients()})

    async def client(request: web.Request) -> web.Response:
        return json_response(client_view(access.client(request.match_info["client_id"])))

    async def disable_client(request: web.Request) -> web.Response:
        return json_response(await access.set_enabled(request.match_info["client_id"], False))

    async def enable_client(request: web.Request) -> web.Response:
        return json_response(await access.set_enabled(request.match_info["client_id"], True))

    async def rotate_client(request: web.Request) -> web.Response:
        return json_response(await access.rotate(request.match_info["client_id"]))

    async def create_token(request: web.Request) -> web.Response:
        return json_response(await access.create_token(await decode(request, TokenCreate)), 201)

    async def tokens(request: web.Request) -> web.Response:
        return json_response({"tokens": access.tokens()})

    async def revoke_token(request: web.Request) -> web.Response:
        return json_response(await registry.revoke_token(request.match_info["token_id"]))

    async def published_keys(request: web.Request) -> web.Response:
        return json_response({"keys": list(registry.state.auth.published_keys.values())})

    async def publish_keys(request: web.Request) -> web.Response:
        """PUT /signing-keys: a router's verifying keys (a JSON list), so other routers accept its tokens."""
        keys = await decode(request, list[PublishedKey])
        await access.publish_keys(keys)
        return json_response({"keys": keys})

    async def rotate_admin_key(request: web.Request) -> web.Response:
        assert data_dir is not None
        key = await access.rotate_admin_key(data_dir)
        return json_response({"admin_key": key, "stored_in": str(admin_key_path(data_dir))})

    async def agents(request: web.Request) -> web.Response:
        return json_response({"agents": registry.agents()})

    async def agent(request: web.Request) -> web.Response:
        return json_response(registry.agent(request.match_info["agent_id"]))

    async def healthz(request: web.Request) -> web.Response:
        storage = registry.store.health
        if not storage.writable:
            return json_response({"status": "unavailable", "error": "storage_unavailable", "field": None,
                                  "message": f"The registry cannot store changes: {storage.problem}",
                                  "since": storage.since, "revision": registry.store.revision}, 503)
        return json_response({"status": "ok", "revision": registry.store.revision})

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=render(prometheus))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def policies(request: web.Request) -> web.Response:
        return json_response({"policies": list(registry.state.policies.values())})

    async def get_policy(request: web.Request) -> web.Response:
        return json_response(registry.policy(path_name(request, "capability")))

    async def put_policy(request: web.Request) -> web.Response:
        capability = path_name(request, "capability")
        return json_response(await registry.put_policy(capability, await decode(request, Policy)))

    async def delete_policy(request: web.Request) -> web.Response:
        capability = path_name(request, "capability")
        await registry.delete_policy(capability)
        return json_response({"capability": capability, "deleted": True})

    async def get_alert_settings(request: web.Request) -> web.Response:
        return json_response(registry.state.alerts)

    async def put_alert_settings(request: web.Request) -> web.Response:
        return json_response(await registry.put_alert_settings(await decode(request, AlertConfig)))

    async def watch(request: web.Request) -> web.StreamResponse:
        if hub is None:
            raise RegistryError(404, "not_found", "This registry has no watch feed")
        subscription = hub.subscribe(since_revision(request))
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            async for event in subscription:
                await response.write(encode_event(event))
        except ConnectionResetError:
            log.info("watch follower went away; it resumes by revision when it returns")
        return response

    def admin_only(handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            gate.admin(request.headers)
            return await handler(request)
        return run

    app = web.Application(middlewares=[errors_as_json], client_max_size=max_body)
    app[REGISTRY_KEY] = registry
    # Agents (registration token) and health probes; the handlers check the token themselves.
    for method, path, handler in (("POST", "/register", register), ("POST", "/heartbeat", heartbeat),
                                  ("POST", "/deregister", deregister), ("POST", "/query", query),
                                  ("GET", "/healthz", healthz), ("GET", "/metrics", metrics)):
        app.router.add_route(method, path, handler)
    for method, path, handler in (
            ("GET", "/agents", agents), ("GET", "/agents/{agent_id}", agent), ("GET", "/policies", policies),
            ("GET", "/policies/{capability}", get_policy), ("PUT", "/policies/{capability}", put_policy),
            ("DELETE", "/policies/{capability}", delete_policy), ("GET", "/settings/alerts", get_alert_settings),
            ("PUT", "/settings/alerts", put_alert_settings), ("GET", "/watch", watch),
            ("POST", "/clients", create_client), ("GET", "/clients", clients), ("GET", "/clients/{client_id}", client),
            ("POST", "/clients/{client_id}/disable", disable_client),
            ("POST", "/clients/{client_id}/enable", enable_client),
            ("POST", "/clients/{client_id}/rotate", rotate_client), ("POST", "/tokens", create_token),
            ("GET", "/tokens", tokens), ("POST", "/tokens/{token_id}/revoke", revoke_token),
            ("GET", "/signing-keys", published_keys), ("PUT", "/signing-keys", publish_keys)):
        app.router.add_route(method, path, admin_only(handler))
    if auth and data_dir is not None:
        app.router.add_post("/admin-key/rotate", admin_only(rotate_admin_key))
    return app
