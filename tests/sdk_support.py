"""Fixtures for the SDK tests: SDK agents, a registry that restarts on its port, a router stand-in,
a mesh whose agents join with registration tokens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import uvicorn
from agent_reach import AgentReachSDK
from agent_reach.atp import RequestFrame
from aiohttp import web
from multidict import CIMultiDict

from conftest import wait_for
from port_shard import in_shard
from recording_support import Received, RecordingServer
from registry.lifecycle import LifecycleConfig
from registry.server import RegistryServer, RegistrySettings
from router.server import RouterServer, RouterServerSettings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections and to binds of port 0."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


# Every port loopback_socket chose in this test process: none is chosen twice.
_chosen: set[int] = set()
_SPARE_PORTS = [port for port in range(10_000, 65_536) if port not in _ephemeral_ports() and in_shard(port)]


def loopback_socket() -> socket.socket:
    """A socket bound to a free port on 127.0.0.1, to hand a server that listens on it, or to close and give
    the port to a child process. The port lies outside the kernel's ephemeral range, so between our choosing
    it and a child binding it no outgoing connection or bind of port 0 (ours, any process's) can take it."""
    for port in random.sample(_SPARE_PORTS, len(_SPARE_PORTS)):
        if port in _chosen:
            continue
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        _chosen.add(port)
        return sock
    raise AssertionError("no free port outside the ephemeral range")


def free_port() -> int:
    with loopback_socket() as sock:
        return sock.getsockname()[1]


# Held until the test process ends: a port that is bound can be handed to no other server.
_refusing: list[socket.socket] = []


def refused_url() -> str:
    """``http://127.0.0.1:PORT`` where nothing listens, for as long as the tests run: the port stays bound
    (never listening), so connections are refused and no server started later, here or in a child process,
    can be given it (a closed free port can be, and then a "dead" address answers)."""
    sock = loopback_socket()
    _refusing.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def run_uvicorn(app: Any, sock: socket.socket) -> AsyncIterator[uvicorn.Server]:
    """Serve an ASGI ``app`` (FastAPI) with uvicorn on ``sock`` until the block ends."""
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn exited during startup"
            await asyncio.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def teardown() -> AsyncIterator[contextlib.AsyncExitStack]:
    """Whatever a test starts registers its stop here; all of it stops at teardown, last first."""
    async with contextlib.AsyncExitStack() as stack:
        yield stack


@pytest.fixture
def registry_at(tmp_path: Path, teardown: contextlib.AsyncExitStack) -> Callable[..., Awaitable[RegistryServer]]:
    """Start registries on a chosen port and data dir, so a test can stop one and start it again."""

    async def start(port: int, data_dir: Path | None = None, auth: bool = False) -> RegistryServer:
        server = RegistryServer(RegistrySettings(data_dir=data_dir or tmp_path / "data", port=port,
                                                 lifecycle=LifecycleConfig(), auth=auth))
        await server.start()
        teardown.push_async_callback(server.stop)
        return server

    return start


@pytest.fixture
def make_agent(teardown: contextlib.AsyncExitStack) -> Callable[..., AgentReachSDK]:
    """New SDK agents with fast heartbeats; every one still running is stopped at teardown."""

    def make(agent_id: str, registry_url: str, **options: Any) -> AgentReachSDK:
        options.setdefault("heartbeat_interval", 0.2)
        agent = AgentReachSDK(agent_id=agent_id, registry_url=registry_url, zone="test", **options)
        teardown.push_async_callback(agent.stop)
        return agent

    return make


async def agent_view(http: aiohttp.ClientSession, registry_url: str, agent_id: str) -> dict[str, Any] | None:
    async with http.get(f"{registry_url}/agents/{agent_id}") as response:
        return await response.json() if response.status == 200 else None


async def wait_state(http: aiohttp.ClientSession, registry_url: str, agent_id: str, state: str,
                     timeout: float = 10.0) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        view = await agent_view(http, registry_url, agent_id)
        return view if view is not None and view["state"] == state else None

    return await wait_for(reached, timeout=timeout, what=f"{agent_id} {state}")


async def post_frame(http: aiohttp.ClientSession, url: str, frame: dict[str, Any] | bytes,
                     headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """POST a request frame to an agent endpoint exactly as the router does."""
    body = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(url, data=body, headers=sent) as response:
        return response.status, await response.json()


Reply = Callable[[RequestFrame, "web.Request"], Awaitable[tuple[int, Any]]]


class StandInRouter(RecordingServer):
    """A recorder on the router's URLs, for what only a recorder can show; routing itself is
    tested against the real router (test_sdk_router.py).

    ``POST /atp`` records each frame and its headers (the API key, traceparent) and answers with
    ``reply(frame, request)``, which may be an answer no real router gives (a body that is not a
    frame); ``POST /completions`` records late-completion notices without judging them.
    """

    def __init__(self, reply: Reply):
        super().__init__(self._answer)
        self.reply = reply

    @property
    def frames(self) -> list[RequestFrame]:
        return [msgspec.json.decode(received.body, type=RequestFrame) for received in self.at("/atp")]

    @property
    def headers(self) -> list[CIMultiDict[str]]:
        return [received.headers for received in self.at("/atp")]

    @property
    def completions(self) -> list[dict[str, Any]]:
        return [received.json() for received in self.at("/completions")]

    async def _answer(self, request: web.Request, received: Received) -> web.Response:
        if received.path == "/completions":
            return web.json_response({"ok": True})
        frame = msgspec.json.decode(received.body, type=RequestFrame)
        status, answer = await self.reply(frame, request)
        return web.Response(body=msgspec.json.encode(answer), status=status, content_type="application/json")


@pytest.fixture
def stand_in_router(teardown: contextlib.AsyncExitStack) -> Callable[[Reply], Awaitable[StandInRouter]]:
    async def start(reply: Reply) -> StandInRouter:
        router = StandInRouter(reply)
        await router.start()
        teardown.push_async_callback(router.stop)
        return router

    return start


async def spawn_example(script: str, *args: str) -> asyncio.subprocess.Process:
    """Run ``examples/<script>`` with this interpreter; its JSON logs go to stderr."""
    return await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / script), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def read_log_until(process: asyncio.subprocess.Process, event: str, timeout: float = 10.0) -> dict[str, Any]:
    """Read the process's JSON log lines until one has ``event``; fail at the deadline."""
    assert process.stderr is not None

    async def scan() -> dict[str, Any]:
        while True:
            line = await process.stderr.readline()
            if not line:
                raise AssertionError(f"process exited before logging {event!r}")
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == event:
                return record

    return await asyncio.wait_for(scan(), timeout)


async def issue_token(http: aiohttp.ClientSession, registry_url: str, admin_key: str, service: str) -> dict[str, Any]:
    """A registration token for ``service``, issued through the registry's admin API: {token, token_id, ...}."""
    async with http.post(f"{registry_url}/tokens", json={"service": service},
                         headers={"X-API-Key": admin_key}) as response:
        assert response.status == 201, await response.text()
        return await response.json()


class TokenMesh(msgspec.Struct, kw_only=True):
    """A registry with auth on, where agents join with registration tokens, and a router following it."""

    registry: RegistryServer
    router: RouterServer
    http: aiohttp.ClientSession

    @property
    def admin(self) -> dict[str, str]:
        assert self.registry.new_admin_key is not None
        return {"X-API-Key": self.registry.new_admin_key}

    async def token(self, service: str) -> dict[str, Any]:
        return await issue_token(self.http, self.registry.url, self.admin["X-API-Key"], service)

    async def routable(self, agent_id: str) -> None:
        mirror = self.router.mirror
        await wait_for(lambda: agent_id in mirror.instances and agent_id in mirror.states
                       and mirror.states[agent_id].state == "healthy", what=f"the router to route to {agent_id}")

    async def registry_post(self, path: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
        async with self.http.post(f"{self.registry.url}{path}", json=body,
                                  headers={"Authorization": f"Bearer {token}"}) as response:
            return response.status, await response.json()


@pytest.fixture
async def token_mesh(start_registry: Callable[..., Awaitable[RegistryServer]],
                     http: aiohttp.ClientSession) -> AsyncIterator[TokenMesh]:
    """Caller auth is off on the router: it signs what it forwards to a token's instances either way."""
    registry = await start_registry(auth=True, silence_timeout=30.0, health_interval=30.0)
    router = RouterServer(RouterServerSettings(port=0, auth=False), hub=registry.hub)
    await router.start()
    await wait_for(lambda: router.mirror.synced, what="the router to load the registry")
    yield TokenMesh(registry=registry, router=router, http=http)
    await router.stop()


def counting_agent(make: Callable[..., AgentReachSDK], agent_id: str, mesh: TokenMesh, capability: str,
                   **options: Any) -> tuple[AgentReachSDK, list[Any]]:
    """An SDK agent serving ``capability`` (echo) that records every payload its handler ran with."""
    agent = make(agent_id, mesh.registry.url, **options)
    ran: list[Any] = []

    @agent.capability(capability)
    async def echo(payload: Any, ctx: Any) -> Any:
        ran.append(payload)
        return {"echo": payload}

    return agent, ran
