"""Joining the mesh with an existing web service: its routes become capabilities (protocol ``rest``).

``@register_capability`` records a route handler and returns it unchanged, so the service behaves
exactly as before. ``sdk.attach(app)`` adds what the mesh needs around the app, not inside the
handlers: the SDK's lifecycle in the app's startup/shutdown, a middleware that counts in-flight
calls and carries the router's context (``X-Reach-Context``) into handlers, refuses calls the
router did not sign when the agent holds a registration token, and ``/healthz`` when the app has
none. A route's path is looked up in the app when the SDK starts, because a FastAPI decorator
placed below ours registers the route only after ours has run.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from agent_reach import logs
from agent_reach.atp import ErrorCode, error_frame, new_request_id
from agent_reach.context import CallContext, rest_context, rest_deadline, serving
from agent_reach.headers import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from agent_reach.guard import CallGuard
    from agent_reach.inflight import Inflight
    from agent_reach.registration import Protocol

HEALTH_PATH = "/healthz"


class JoiningAgent(typing.Protocol):
    """What a host needs of the agent it serves (``AgentReachSDK`` is one): named here, so the hosts
    depend on what they use and the SDK can hand itself over without the two modules importing
    each other."""

    inflight: Inflight
    guard: CallGuard

    def add_route(self, name: str, handler: Any, *, protocol: Protocol = "rest", version: str = "1.0",
                  path: str | None = None, **options: Any) -> None: ...

    def route_name(self, handler: Any) -> str | None: ...

    def route_limit(self, name: str) -> int: ...

    def mount(self, app: web.Application) -> None: ...

    async def check_health(self) -> tuple[bool, str]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

_encoder = msgspec.json.Encoder()


def register_capability(sdk: JoiningAgent, name: str, protocol: Protocol = "rest", version: str = "1.0",
                        path: str | None = None, **options: Any) -> Callable[[Any], Any]:
    """Declare an existing route handler as capability ``name``; returns the handler itself.

    ``path`` is needed only when the route cannot be found in the attached app.
    ``options`` are the other registration fields (description, timeout_sla_ms, ...).
    """

    def decorate(handler: Any) -> Any:
        sdk.add_route(name, handler, protocol=protocol, version=version, path=path, **options)
        return handler

    return decorate


def _refusal(headers: Mapping[str, str], code: ErrorCode, message: str) -> tuple[int, bytes]:
    """An error frame for a call to a wrapped route that never reaches the route's handler."""
    return code.http_status, _encoder.encode(error_frame(headers.get(REQUEST_ID_HEADER, ""), code, message))


Receive = Callable[[], Awaitable[dict[str, Any]]]


async def _read_body(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The whole request body (None past ``limit``) and a ``receive`` that hands it to the app again."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None, receive
        if not message.get("more_body"):
            break
    replay: list[dict[str, Any]] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replayed() -> dict[str, Any]:
        return replay.pop() if replay else await receive()

    return replay[0]["body"], replayed


class RouteCall(contextlib.ExitStack):
    """One call to a wrapped route: counted in flight, its context visible to nested calls, logs bound."""

    def __init__(self, sdk: JoiningAgent, capability: str, headers: Mapping[str, str]):
        super().__init__()
        self._sdk = sdk
        self.call = CallContext(headers.get(REQUEST_ID_HEADER) or new_request_id(), capability, rest_context(headers),
                                deadline=rest_deadline(headers))
        self.status = 200

    def __enter__(self) -> RouteCall:
        self._slot = self._sdk.inflight.enter(self.call.request_id, self.call.capability)
        self.enter_context(logs.bind(request_id=self.call.request_id, capability=self.call.capability))
        self.enter_context(serving(self.call))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Never swallows the route's exception: nothing entered here suppresses one."""
        failed = exc_info[0] is not None or self.status >= 500
        self._sdk.inflight.leave(self._slot)
        self._sdk.inflight.count_outcome("error" if failed else "ok", self.call.tokens_reported)
        super().__exit__(*exc_info)


class AiohttpHost:
    """An aiohttp Application the SDK joins: ATP routes mounted, lifecycle in its signals."""

    health_path = HEALTH_PATH

    def __init__(self, sdk: JoiningAgent, app: web.Application):
        self._sdk = sdk
        self.app = app
        sdk.mount(app)
        app.middlewares.append(self._middleware)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        await self._sdk.start()

    async def _stop(self, app: web.Application) -> None:
        await self._sdk.stop()

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        name = self._sdk.route_name(request.match_info.handler)
        if name is None:
            return await handler(request)
        if self._sdk.guard.active:
            # read() keeps the body, so the handler reads it again as usual.
            refused = self._sdk.guard.refusal(name, request.method, request.headers, await request.read())
            if refused is not None:
                status, body = _refusal(request.headers, ErrorCode.UNAUTHENTICATED, refused)
                return web.Response(body=body, status=status, content_type="application/json")
        with RouteCall(self._sdk, name, request.headers) as call:
            response = await handler(request)
            call.status = response.status
            return response

    def path_of(self, handler: Any) -> str | None:
        for route in self.app.router.routes():
            if route.handler is handler and route.resource is not None:
                return route.resource.canonical
        return None

    def prepare(self, paths: Mapping[str, str]) -> None:
        """Nothing to do: the middleware recognises routes by handler, not by path."""


class AsgiHost:
    """A FastAPI/Starlette app the SDK joins: lifecycle inside its lifespan, a raw ASGI middleware."""

    health_path = HEALTH_PATH

    def __init__(self, sdk: JoiningAgent, app: Any):
        self.sdk = sdk
        self.app = app
        self.serves_health = False
        self._names: dict[str, str] = {}
        app.add_middleware(_AsgiMiddleware, host=self)
        original = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(instance: Any) -> AsyncIterator[Any]:
            async with original(instance) as state:
                await sdk.start()
                try:
                    yield state
                finally:
                    await sdk.stop()

        app.router.lifespan_context = lifespan

    def path_of(self, handler: Any) -> str | None:
        return next((route.path for route in self.app.routes if getattr(route, "endpoint", None) is handler), None)

    def prepare(self, paths: Mapping[str, str]) -> None:
        """Index capabilities by path (raw ASGI sees paths, not handlers) and decide who serves /healthz."""
        self._names = {path: name for name, path in paths.items()}
        self.serves_health = not any(getattr(route, "path", None) == HEALTH_PATH for route in self.app.routes)

    def capability_at(self, path: str) -> str | None:
        return self._names.get(path)

    async def health(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        healthy, detail = await self.sdk.check_health()
        await _answer(send, 200 if healthy else 503, _encoder.encode({"status": detail}))


class _AsgiMiddleware:
    """Header values are read as UTF-8, as aiohttp reads them and as the router writes X-Reach-Context
    (latin-1 would garble any non-ASCII context); bytes that are not UTF-8 become U+FFFD rather than
    surrogates a JSON decoder refuses, so a malformed header cannot fail the call."""

    def __init__(self, app: Any, host: AsgiHost):
        self.app = app
        self.host = host

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == HEALTH_PATH and self.host.serves_health:
            await self.host.health(send)
            return
        name = self.host.capability_at(scope["path"])
        if name is None:
            await self.app(scope, receive, send)
            return
        headers = CIMultiDict((key.decode("latin-1"), value.decode("utf-8", "replace"))
                              for key, value in scope["headers"])
        if self.host.sdk.guard.active:
            receive = await self._admitted(name, scope["method"], headers, receive, send)
            if receive is None:
                return
        with RouteCall(self.host.sdk, name, headers) as call:
            async def send_noting_status(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    call.status = message["status"]
                await send(message)

            await self.app(scope, receive, send_noting_status)

    async def _admitted(self, name: str, method: str, headers: Mapping[str, str], receive: Receive,
                        send: Callable[[dict[str, Any]], Awaitable[None]]) -> Receive | None:
        """The ``receive`` to hand the app (the body is read to check its signature), or None once refused."""
        limit = self.host.sdk.route_limit(name)
        body, receive = await _read_body(receive, limit)
        if body is None:
            await _answer(send, *_refusal(headers, ErrorCode.PAYLOAD_TOO_LARGE, f"Payload over {limit} bytes"))
            return None
        refused = self.host.sdk.guard.refusal(name, method, headers, body)
        if refused is not None:
            await _answer(send, *_refusal(headers, ErrorCode.UNAUTHENTICATED, refused))
            return None
        return receive


async def _answer(send: Callable[[dict[str, Any]], Awaitable[None]], status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class ExternalHost:
    """Routes served by something the SDK cannot look into; every wrapped route needs ``path=``."""

    health_path = None

    def path_of(self, handler: Any) -> str | None:
        return None

    def prepare(self, paths: Mapping[str, str]) -> None:
        """Nothing to prepare: the SDK does not see these requests."""


Host = AiohttpHost | AsgiHost | ExternalHost


def host_for(sdk: JoiningAgent, app: Any) -> Host:
    if isinstance(app, str):
        return ExternalHost()
    if isinstance(app, web.Application):
        return AiohttpHost(sdk, app)
    if hasattr(app, "add_middleware") and hasattr(getattr(app, "router", None), "lifespan_context"):
        return AsgiHost(sdk, app)
    raise TypeError(f"Cannot attach to {type(app).__name__}: expected an aiohttp Application, "
                    "a FastAPI/Starlette app, or the base URL of a service the SDK does not run")
