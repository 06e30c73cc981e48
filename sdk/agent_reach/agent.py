"""AgentReachSDK: an agent's membership in the mesh, from declaration to leaving cleanly.

Declare capabilities (native ATP handlers with ``@sdk.capability``, or existing routes with
``register_capability``), then ``start``/``serve`` (the SDK's own aiohttp endpoint) or
``attach(app)`` (an existing service). From then on the SDK registers, heartbeats with load and
health, serves ATP frames, warns about a blocked event loop, and on ``stop`` or SIGTERM
deregisters, answers new calls ``BUSY`` and drains the ones in flight. An agent holding a
registration token refuses calls the router did not sign (see :mod:`agent_reach.guard`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import aiohttp
import msgspec
from aiohttp import web
from yarl import URL

from agent_reach.admission import Limits
from agent_reach.dispatch import BusinessFailure, Dispatcher, Handler, LateCompletion, Native
from agent_reach.guard import CallGuard
from agent_reach.heartbeat import RegistryLink, RegistryUnavailable
from agent_reach.inflight import Inflight
from agent_reach.mq_serving import MAX_DELIVERIES, VISIBILITY_S, MqServer
from agent_reach.mq_wire import endpoint_for
from agent_reach.registration import Capability, HeartbeatRequest, Protocol, RegisterRequest, TrustLevel
from agent_reach.serving import cancel, close, listen
from agent_reach.signing import DEFAULT_WINDOW_S, GRPC_SIGNED_PATH, signing_key
from agent_reach.socket_serving import SocketServer
from agent_reach.socket_wire import MAX_ENVELOPE_BYTES
from agent_reach.sse import ERROR, RESPONSE, EventWriter, encode_event
from agent_reach.watchdog import watch_loop
from agent_reach.wrap import HEALTH_PATH, AiohttpHost, ExternalHost, Host, host_for

if TYPE_CHECKING:  # the grpc extra, imported when a grpc capability is served
    from agent_reach.grpc_serving import GrpcServer

__all__ = ["AgentReachSDK", "BusinessFailure", "atp_handler"]

log = logging.getLogger("agentreach.sdk")

# Room for the frame around the payload when sizing the largest body the SDK's server reads.
FRAME_ENVELOPE_BYTES = 64 * 1024
HEALTH_TIMEOUT = 2.0
# After the drain deadline, how long abandoned calls get to send their BUSY answers.
ABANDON_GRACE = 2.0
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# Where each protocol the SDK serves natively puts a capability, below the agent's base URL.
NATIVE_PATHS = {"atp": "/atp/{capability}", "websocket": "/ws/{capability}"}
# A grpc capability's endpoint until start: its gRPC server's host:port, known once it listens.
GRPC_UNBOUND = "grpc-server-not-started"
# Protocols the SDK serves natively: those above, gRPC calls to the agent's gRPC server (agent_reach.grpc_serving)
# and calls taken from a broker's stream (agent_reach.mq_serving).
NativeProtocol = Literal["atp", "websocket", "grpc", "mq"]
NATIVE_PROTOCOLS = (*NATIVE_PATHS, "grpc", "mq")

_encoder = msgspec.json.Encoder()


class Routed(NamedTuple):
    """A capability served by an existing route; its endpoint is that route's path, found at start."""

    capability: Capability
    handler: Any
    path: str | None


def _declare(name: str, **fields: Any) -> Capability:
    """A capability checked against the registry's schema now, so a bad name fails at import time."""
    return msgspec.convert({"name": name, **fields}, Capability)


def _advertised(host: str) -> str:
    return socket.getfqdn() if host in ("", "0.0.0.0", "::") else host


class AgentReachSDK:
    def __init__(self, agent_id: str, registry_url: str | Sequence[str], zone: str, service: str | None = None,
                 metadata: dict[str, Any] | None = None, registration_token: str | None = None,
                 heartbeat_interval: float = 3.0, direct_fallback: bool = False, max_inflight: int = 64,
                 base_url: str | None = None, drain_timeout: float = 30.0, verify_calls: bool = True,
                 signature_window_s: float = DEFAULT_WINDOW_S, grpc_port: int = 0, broker: str | None = None,
                 mq_visibility_s: float = VISIBILITY_S, mq_max_deliveries: int = MAX_DELIVERIES):
        """``registry_url``: one registry, or several (a list or comma-separated) to fail over between.
        ``verify_calls`` (with a ``registration_token``): refuse calls the router did not sign,
        within ``signature_window_s`` of this host's clock; direct fallback calls only if ``direct_fallback``.
        ``grpc_port``: where capabilities with ``protocol="grpc"`` are served (0: any free port).
        ``broker`` (``redis://host:port``): where ``protocol="mq"`` capabilities take their calls; a call this
        agent held for ``mq_visibility_s`` without a sign of life goes to a sibling, and one delivered more than
        ``mq_max_deliveries`` times is dead-lettered (agent_reach.mq_serving)."""
        self.agent_id = agent_id
        self.registry_url = registry_url
        self.zone = zone
        self.service = service
        self.metadata = dict(metadata or {})
        self.registration_token = registration_token
        self.heartbeat_interval = heartbeat_interval
        self.direct_fallback = direct_fallback
        self.base_url = base_url
        self.drain_timeout = drain_timeout
        self.broker = broker
        self.mq_visibility_s = mq_visibility_s
        self.mq_max_deliveries = mq_max_deliveries
        self.mq: MqServer | None = None
        self.inflight = Inflight(max_inflight)
        self.last_health = "ok"
        self.link: RegistryLink | None = None
        self._natives: dict[str, Native] = {}
        self._routed: dict[str, Routed] = {}
        self._paths: dict[str, str] = {}
        self._health: Callable[[], Any] | None = None
        self._host: Host | None = None
        key = signing_key(registration_token) if registration_token and verify_calls else None
        self.guard = CallGuard(agent_id, key, direct_fallback, signature_window_s)
        self._dispatcher = Dispatcher(agent_id, self.inflight, self._report_late, self.guard)
        self._sockets = SocketServer(self._dispatcher)
        self.grpc_port = grpc_port
        self._grpc: GrpcServer | None = None
        # The gRPC server's host:port once it listens (the endpoint of every grpc capability).
        self.grpc_address: str | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._notices: set[asyncio.Task[None]] = set()

    # Declaring what this agent can do.

    def capability(self, name: str, *, version: str = "1.0", description: str = "", examples: Sequence[str] = (),
                   timeout_sla_ms: int = 30_000, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
                   idempotent: bool = False, trust_level: TrustLevel | None = None,
                   protocol: NativeProtocol = "atp", stream: str | None = None,
                   input_schema: dict[str, Any] | None = None, output_schema: dict[str, Any] | None = None,
                   **prices: float) -> Callable[[Handler], Handler]:
        """Serve ``async def handler(payload, ctx)`` as capability ``name`` over ATP; a handler that is an
        async generator streams its answer, one chunk per ``yield`` (agent_reach.dispatch). ``protocol``:
        how the router reaches it, an HTTP POST per call (``atp``), calls multiplexed on a WebSocket the
        router keeps open (``websocket``, agent_reach.socket_wire), gRPC calls to the agent's gRPC server
        (``grpc``, agent_reach.grpc_wire; the ``grpc`` extra), or calls taken from the request stream
        ``stream`` on the agent's ``broker`` (``mq``, agent_reach.mq_wire; by default
        ``agentreach.<service>.<name>``, shared by the service's instances); the handler is the same. ``prices``:
        ``cost_per_call``, ``cost_per_1k_input_tokens``, ``cost_per_1k_output_tokens`` (agent_reach.usage).
        ``input_schema`` / ``output_schema``: JSON Schemas of the payload and the answer; the router refuses a
        payload that fails the input_schema, and A2A cards and MCP tools show both."""
        schemas = {key: schema for key, schema in (("input_schema", input_schema), ("output_schema", output_schema))
                   if schema is not None}
        if protocol not in NATIVE_PROTOCOLS:
            raise ValueError(f"protocol must be one of {sorted(NATIVE_PROTOCOLS)}, not {protocol!r}")
        capability = _declare(name, endpoint=self._native_endpoint(name, protocol, stream), protocol=protocol,
                              version=version,
                              description=description, examples=list(examples), timeout_sla_ms=timeout_sla_ms,
                              max_payload_bytes=max_payload_bytes, idempotent=idempotent, trust_level=trust_level,
                              **schemas, **prices)

        def decorate(handler: Handler) -> Handler:
            if not (inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler)):
                raise TypeError(f"{handler.__qualname__} must be `async def handler(payload, ctx)`; "
                                "sync work would block every other call and the heartbeats")
            self._claim(name)
            self._natives[name] = Native(capability, handler)
            return handler

        return decorate

    def _native_endpoint(self, name: str, protocol: str, stream: str | None) -> str:
        if protocol in NATIVE_PATHS:
            return NATIVE_PATHS[protocol].format(capability=name)
        if protocol == "grpc":
            return GRPC_UNBOUND
        if self.broker is None:
            raise ValueError(f"capability {name!r} is served over mq: give the agent its broker= (redis://host:port)")
        return endpoint_for(self.broker, stream or f"agentreach.{self.service or self.agent_id}.{name}")

    def add_route(self, name: str, handler: Any, *, protocol: Protocol = "rest", version: str = "1.0",
                  path: str | None = None, **options: Any) -> None:
        """Declare an existing route as capability ``name`` (what ``register_capability`` calls)."""
        self._claim(name)
        # The endpoint is the route's path, known only once the app has registered it (see start).
        capability = _declare(name, endpoint=path or "/", protocol=protocol, version=version, **options)
        self._routed[name] = Routed(capability, handler, path)

    def _claim(self, name: str) -> None:
        if name in self._natives or name in self._routed:
            raise ValueError(f"Capability {name!r} is declared twice on agent {self.agent_id!r}")

    def route_name(self, handler: Any) -> str | None:
        return next((name for name, routed in self._routed.items() if routed.handler is handler), None)

    def route_limit(self, name: str) -> int:
        return self._routed[name].capability.max_payload_bytes

    def health_check(self, check: Callable[[], Any]) -> Callable[[], Any]:
        """Use ``check`` (sync or async; False or an exception means unhealthy) for /healthz and heartbeats."""
        self._health = check
        return check

    async def check_health(self) -> tuple[bool, str]:
        """Run the user's check (if any); the result also goes out with the next heartbeat."""
        try:
            outcome = self._health() if self._health is not None else True
            if inspect.isawaitable(outcome):
                outcome = await asyncio.wait_for(outcome, HEALTH_TIMEOUT)
            detail = "fail" if outcome is False else "ok"
        except Exception as exc:
            detail = f"fail: {exc!r}"[:256]
        self.last_health = detail
        if self._grpc is not None:
            await self._grpc.set_health(detail == "ok")
        return detail == "ok", detail

    # Serving.

    def attach(self, app: Any, base_url: str | None = None) -> Any:
        """Join the mesh alongside an existing aiohttp or FastAPI app (or a base URL served elsewhere)."""
        if base_url is not None or isinstance(app, str):
            self.base_url = base_url or app
        self._host = host_for(self, app)
        return app

    def mount(self, app: web.Application) -> None:
        """Add the ATP endpoints (POST /atp/{capability}, the WebSocket at /ws/{capability}) and /healthz,
        unless the app has its own."""
        app.router.add_post(NATIVE_PATHS["atp"], self._atp_endpoint)
        app.router.add_get(NATIVE_PATHS["websocket"], self._socket_endpoint)
        if not any(resource.canonical == HEALTH_PATH for resource in app.router.resources()):
            app.router.add_get(HEALTH_PATH, self._healthz_endpoint)

    async def _atp_endpoint(self, request: web.Request) -> web.StreamResponse:
        try:
            body: bytes | None = await request.read()
        except web.HTTPRequestEntityTooLarge:
            body = None
        name = request.match_info["capability"]
        native = self._natives.get(name)
        out = EventWriter(request, {})
        reply = await self._dispatcher.handle(native if native is None or native.capability.protocol == "atp" else None,
                                              name, body, request.headers,
                                              caller_gone=lambda: _hung_up(request), out=out)
        if out.started:
            return await out.end(encode_event(RESPONSE if reply.status == 200 else ERROR, reply.body))
        return web.Response(body=reply.body, status=reply.status, content_type="application/json")

    async def _socket_endpoint(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["capability"]
        native = self._natives.get(name)
        if native is None or native.capability.protocol != "websocket":
            raise web.HTTPNotFound(text=f"This agent serves no capability {name!r} over WebSocket")
        limit = native.capability.max_payload_bytes + FRAME_ENVELOPE_BYTES + MAX_ENVELOPE_BYTES
        return await self._sockets.serve(request, native, name, limit)

    async def _healthz_endpoint(self, request: web.Request) -> web.Response:
        healthy, detail = await self.check_health()
        return web.json_response({"status": detail, "agent_id": self.agent_id}, status=200 if healthy else 503)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Serve native capabilities on host:port (unless attached to an app), then join the registry."""
        if self._session is not None:
            raise RuntimeError(f"Agent {self.agent_id!r} is already started")
        if not (self._natives or self._routed):
            raise ValueError(f"Agent {self.agent_id!r} declares no capability; nothing to register")
        if self._host is None:
            await self._listen(host, port)
        elif self._over_http() and not isinstance(self._host, AiohttpHost):
            raise ValueError("Native capabilities need an aiohttp server: use sdk.start() or attach an aiohttp app")
        try:
            await self._serve_grpc(host)
            await self._consume()
            await self._join()
        except BaseException:
            await self._close()
            raise

    async def _listen(self, host: str, port: int) -> None:
        limit = max(native.capability.max_payload_bytes for native in self._natives.values())
        app = web.Application(client_max_size=limit + FRAME_ENVELOPE_BYTES)
        self.mount(app)
        # No share per address: an agent's callers are the mesh's routers, a few addresses with many calls each.
        self._runner, bound = await listen(app, host, port, shutdown_timeout=2.0,
                                           limits=Limits(max_connections_per_peer=0))
        self.base_url = self.base_url or f"http://{_advertised(host)}:{bound}"
        log.info("agent listening", extra={"agent_id": self.agent_id, "base_url": self.base_url,
                                           "capabilities": sorted(self._natives)})

    def _over_http(self) -> dict[str, Native]:
        return {name: native for name, native in self._natives.items()
                if native.capability.protocol not in ("grpc", "mq")}

    async def _serve_grpc(self, host: str) -> None:
        natives = {name: native for name, native in self._natives.items() if native.capability.protocol == "grpc"}
        if not natives:
            return
        try:
            from agent_reach.grpc_serving import GrpcServer
        except ImportError as exc:
            raise RuntimeError("protocol='grpc' needs the grpc extra: pip install 'agent-reach-sdk[grpc]'") from exc
        self._grpc = GrpcServer(self._dispatcher, natives)
        bound = await self._grpc.start(host, self.grpc_port)
        advertised = _advertised(host)
        self.grpc_address = f"[{advertised}]:{bound}" if ":" in advertised else f"{advertised}:{bound}"
        log.info("agent serving gRPC", extra={"agent_id": self.agent_id, "address": self.grpc_address,
                                               "capabilities": sorted(natives)})

    async def _consume(self) -> None:
        """Start taking the mq capabilities' calls from the broker, before the registry routes any here."""
        served = [native for native in self._natives.values() if native.capability.protocol == "mq"]
        if not served:
            return
        assert self.broker is not None  # checked when each was declared
        from agent_reach.redis_broker import RedisBroker  # imported only here: it needs the mq extra (redis)

        self.mq = MqServer(self._dispatcher, self.guard, self.inflight, RedisBroker(self.broker), self.agent_id,
                           self.mq_visibility_s, self.mq_max_deliveries)
        await self.mq.start(served)

    def _resolve_paths(self) -> None:
        for name, routed in self._routed.items():
            path = routed.path or (self._host.path_of(routed.handler) if self._host is not None else None)
            if path is None:
                raise LookupError(f"No route found for capability {name!r} ({routed.handler.__qualname__}): "
                                  "declare the route on the app given to sdk.attach(app), or pass path=")
            self._paths[name] = path
        if self._host is not None:
            self._host.prepare(self._paths)

    def registration(self) -> RegisterRequest:
        capabilities = [msgspec.structs.replace(native.capability, endpoint=self.grpc_address)
                        if native.capability.protocol == "grpc" and self.grpc_address is not None
                        else native.capability for native in self._natives.values()]
        capabilities += [msgspec.structs.replace(routed.capability, endpoint=self._paths[name])
                         for name, routed in self._routed.items()]
        health_url = HEALTH_PATH if self._host is None else self._host.health_path
        if self.grpc_address is not None and all(capability.protocol == "grpc" for capability in capabilities):
            health_url = f"grpc://{self.grpc_address}"  # probed with grpc.health.v1.Health
        return RegisterRequest(agent_id=self.agent_id, capabilities=capabilities, service=self.service,
                               base_url=self.base_url, health_url=health_url,
                               metadata={"zone": self.zone, **self.metadata}, direct_fallback=self.direct_fallback)

    def _arm_guard(self) -> None:
        """Tell the guard where each capability is registered, and say plainly when calls go unchecked."""
        self.guard.expect({capability.name: GRPC_SIGNED_PATH if capability.protocol == "grpc"
                           else URL(capability.endpoint).path for capability in self.registration().capabilities})
        if self.registration_token and not self.guard.active:
            log.warning("verify_calls is off: calls that bypass the router are served",
                        extra={"agent_id": self.agent_id})
        elif self.guard.active and isinstance(self._host, ExternalHost):
            log.warning("routes served outside the SDK are not verified; check X-Reach-Signature there "
                        "with agent_reach.signing.verify", extra={"capabilities": sorted(self._routed)})

    async def heartbeat(self) -> HeartbeatRequest:
        _, health = await self.check_health()
        return HeartbeatRequest(agent_id=self.agent_id, load=self.inflight.load, inflight=self.inflight.count,
                                health=health, metrics={**self.inflight.counters, **self._mq_counts()})

    def _mq_counts(self) -> dict[str, int]:
        """What became of mq entries besides plain answers: redeliveries, refusals, dead letters, drops."""
        return {f"mq_{what}": count for what, count in self.mq.counts.items()} if self.mq is not None else {}

    async def _join(self) -> None:
        if self.base_url is None:
            raise ValueError("The agent's base URL is unknown: pass base_url= to AgentReachSDK or to attach()")
        self._resolve_paths()
        self._arm_guard()
        self._session = aiohttp.ClientSession()
        self.link = RegistryLink(self._session, self.registry_url, interval=self.heartbeat_interval,
                                 registration=self.registration, heartbeat=self.heartbeat,
                                 token=self.registration_token)
        try:
            await self.link.register()
        except RegistryUnavailable as exc:
            log.warning("registry unreachable at start; serving anyway and registering when it is back",
                        extra={"error": str(exc)})
        self.inflight.draining = False
        self._heartbeats = asyncio.create_task(self.link.run())
        self._watchdog = asyncio.create_task(watch_loop(self.inflight))

    async def stop(self) -> None:
        """Deregister, answer new calls BUSY, drain in-flight calls (up to drain_timeout), then close."""
        if self._session is None or self.inflight.draining:
            return
        self.inflight.draining = True
        log.info("stopping: deregistering and draining", extra={"inflight": self.inflight.count})
        await cancel(self._heartbeats)
        assert self.link is not None
        await self.link.deregister(self.agent_id)
        if not await self.inflight.wait_idle(self.drain_timeout):
            log.warning("drain deadline passed; abandoning calls still running",
                        extra={"abandoned": self._dispatcher.abandon(), "drain_timeout_s": self.drain_timeout})
            await self.inflight.wait_idle(ABANDON_GRACE)
        await self._close()
        log.info("stopped", extra={"agent_id": self.agent_id})

    async def _close(self) -> None:
        await cancel(self._heartbeats, self._watchdog, *self._notices)
        await self._sockets.close()
        if self._grpc is not None:
            await self._grpc.stop(ABANDON_GRACE)
            self._grpc = self.grpc_address = None
        if self.mq is not None:
            await self.mq.close()
            self.mq = None
        await close(self._runner, self._session)
        self._runner = self._session = None

    def serve(self, host: str = "127.0.0.1", port: int = 9000) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly (blocking; for an agent's ``__main__``)."""
        asyncio.run(self._serve_until_signalled(host, port))

    async def _serve_until_signalled(self, host: str, port: int) -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        await self.start(host, port)
        try:
            await stopping.wait()
        finally:
            await self.stop()

    # Telling the router about a result it stopped waiting for.

    def _report_late(self, url: str, notice: LateCompletion) -> None:
        log.warning("handler finished after its deadline; telling the router", extra={"completion_url": url})
        task = asyncio.create_task(self._post_notice(url, notice))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _post_notice(self, url: str, notice: LateCompletion) -> None:
        assert self._session is not None
        try:
            async with self._session.post(url, data=_encoder.encode(notice), timeout=aiohttp.ClientTimeout(total=2),
                                          headers={"Content-Type": "application/json"}) as response:
                if response.status >= 400:
                    log.warning("router refused the late-completion notice", extra={"status": response.status})
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("could not send the late-completion notice", extra={"error": repr(exc)})


def _hung_up(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def atp_handler(sdk: AgentReachSDK, name: str, **options: Any) -> Callable[[Handler], Handler]:
    """``@atp_handler(sdk, name=...)``: the same as ``@sdk.capability(name, ...)``."""
    return sdk.capability(name, **options)
