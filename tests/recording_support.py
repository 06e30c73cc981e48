"""One recording server for every test that needs something at the other end of a real connection:
an aiohttp server on 127.0.0.1 that keeps each request as it arrived and answers as the test tells it.

Agents, a router stand-in and a signing recorder are all this server with a different ``answer``, so
what a test reads back (method, path, headers, the raw body) is the same everywhere. ``GET /healthz``
is the registry's probe, answered from ``healthy`` and counted, never recorded: a recording holds
only what a caller sent.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self, TypeVar

import msgspec
from agent_reach.serving import listen
from aiohttp import web
from multidict import CIMultiDict


class Loopback:
    """Something listening on ``host``:``port``: 127.0.0.1, or another loopback address (all of
    127.0.0.0/8 is loopback on Linux) when a test needs two addresses."""

    host = "127.0.0.1"
    port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class Received(msgspec.Struct):
    """One request as it arrived; ``arrived`` is time.monotonic() when its body was read, so a test can
    put what the sender did before it in order without a wall-clock bound."""

    method: str
    path: str
    headers: CIMultiDict[str]
    body: bytes
    arrived: float

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Answer = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


class RecordingServer(Loopback):
    """Records every request (but the health probe) in ``received``, then answers ``answer(request,
    received)``. ``start`` picks a free port unless given one (a restart on the same port)."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.received: list[Received] = []
        self.healthy = True
        self.health_checks = 0
        self._runner: web.AppRunner | None = None

    def at(self, path: str) -> list[Received]:
        return [received for received in self.received if received.path == path]

    async def start(self, port: int = 0) -> Self:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("*", "/{path:.*}", self._record)
        self._runner, self.port = await listen(app, self.host, port, shutdown_timeout=0.5)
        return self

    async def stop(self) -> None:
        """Stop listening (new connections are refused), finish the requests in flight, close."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def kill(self) -> None:
        """Die abruptly, as a killed process does: stop listening and reset every open connection,
        requests in flight included."""
        assert self._runner is not None and self._runner.server is not None
        for site in list(self._runner.sites):
            await site.stop()
        for handler in self._runner.server.connections:
            if handler.transport is not None:
                handler.transport.abort()
        await self.stop()

    async def _healthz(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def _record(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received = Received(request.method, request.path, CIMultiDict(request.headers), body, time.monotonic())
        self.received.append(received)
        return await self.answer(request, received)


Server = TypeVar("Server", bound=RecordingServer)


@contextlib.asynccontextmanager
async def starting(kind: Callable[..., Server]) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """Start servers of ``kind`` (the arguments of each start go to ``kind``); all of them stop when the
    block ends."""
    servers: list[Server] = []

    async def start(*args: Any, **options: Any) -> Server:
        server = await kind(*args, **options).start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()
