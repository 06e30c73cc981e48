"""The registry's HTTP API: JSON in, JSON out, every failure a 4xx/5xx body naming code and field."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from agent_reach.registration import AgentRef, CapabilityRef, HeartbeatRequest, RegisterRequest
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from registry.errors import RegistryError, from_decode_error
from registry.health import HealthChecker
from registry.metrics import metrics_registry, render
from registry.service import Registry

log = logging.getLogger("agentreach.registry.api")

DEFAULT_MAX_BODY = 1024 * 1024
REGISTRY_KEY = web.AppKey("registry", Registry)

_decoders = {t: msgspec.json.Decoder(t) for t in (RegisterRequest, HeartbeatRequest, AgentRef, CapabilityRef)}
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


@web.middleware
async def errors_as_json(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
    try:
        return await handler(request)
    except RegistryError as error:
        return error_response(error)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(RegistryError(413, "payload_too_large", exc.text or "Request body too large"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return error_response(RegistryError(exc.status, code, exc.reason))
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return error_response(RegistryError(500, "internal_error", "The registry failed to handle this request"))


def create_app(registry: Registry, checker: HealthChecker | None = None, *,
               max_body: int = DEFAULT_MAX_BODY) -> web.Application:
    prometheus = metrics_registry(registry, checker)

    async def register(request: web.Request) -> web.Response:
        return json_response(await registry.register(await decode(request, RegisterRequest)))

    async def heartbeat(request: web.Request) -> web.Response:
        beat = await decode(request, HeartbeatRequest)
        return json_response({"agent_id": beat.agent_id, "state": registry.heartbeat(beat)})

    async def deregister(request: web.Request) -> web.Response:
        ref = await decode(request, AgentRef)
        await registry.deregister(ref.agent_id)
        return json_response({"agent_id": ref.agent_id, "deregistered": True})

    async def query(request: web.Request) -> web.Response:
        return json_response(registry.query((await decode(request, CapabilityRef)).capability))

    async def agents(request: web.Request) -> web.Response:
        return json_response({"agents": registry.agents()})

    async def agent(request: web.Request) -> web.Response:
        return json_response(registry.agent(request.match_info["agent_id"]))

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok", "revision": registry.store.revision})

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=render(prometheus))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application(middlewares=[errors_as_json], client_max_size=max_body)
    app[REGISTRY_KEY] = registry
    app.router.add_post("/register", register)
    app.router.add_post("/heartbeat", heartbeat)
    app.router.add_post("/deregister", deregister)
    app.router.add_post("/query", query)
    app.router.add_get("/agents", agents)
    app.router.add_get("/agents/{agent_id}", agent)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
