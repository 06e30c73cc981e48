"""A registry+router mesh for the router's tests, and a client for both.

Everything listens on 127.0.0.1 and speaks real HTTP: the registry is the real RegistryServer,
the router the real RouterServer (following the registry in process through its WatchHub, or
over HTTP `GET /watch`), and the agents (agent_support) plain aiohttp servers with no SDK. Tests
wait for conditions with a deadline (``wait_for``), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from multidict import CIMultiDict

from agent_support import Agent, SlowConnectTarget
from conftest import wait_for
from mesh.policy import Policy
from registry.access import read_admin_key
from registry.server import RegistryServer
from router.api import DEFAULT_MAX_BODY
from router.core import Router, RouterSettings
from router.server import RouterServer, RouterServerSettings


class Answer(msgspec.Struct):
    status: int
    body: Any
    headers: CIMultiDict[str]

    @property
    def route(self) -> dict[str, Any]:
        return self.body.get("route", {})


def capability(name: str, endpoint: str, protocol: str = "rest", **fields: Any) -> dict[str, Any]:
    return {"name": name, "endpoint": endpoint, "protocol": protocol, "timeout_sla_ms": 5000, **fields}


class Mesh:
    """A real registry and a real router following it, plus a client for both. With auth on,
    ``admin_key`` is the registry's, sent on every registry call the helpers make."""

    def __init__(self, registry: RegistryServer, router: RouterServer, http: aiohttp.ClientSession,
                 admin_key: str | None = None):
        self.registry = registry
        self.router_server = router
        self.http = http
        self.admin_key = admin_key
        self._beating: dict[str, asyncio.Task[None]] = {}

    @property
    def admin(self) -> dict[str, str]:
        return {"X-API-Key": self.admin_key} if self.admin_key is not None else {}

    @property
    def router(self) -> Router:
        assert self.router_server.router is not None
        return self.router_server.router

    @property
    def url(self) -> str:
        return self.router_server.url

    async def register(self, agent_id: str, capabilities: list[dict[str, Any]],
                       metadata: dict[str, Any] | None = None, service: str | None = None) -> None:
        """Register an instance; its service defaults to its first capability's name (one service
        owns a capability, so every instance of it must belong to the same service)."""
        body = {"agent_id": agent_id, "capabilities": capabilities, "metadata": metadata or {},
                "service": service or capabilities[0]["name"]}
        async with self.http.post(f"{self.registry.url}/register", json=body, headers=self.admin) as response:
            assert response.status == 200, await response.text()

    async def add(self, agent: Agent | SlowConnectTarget, name: str = "echo", *, agent_id: str | None = None,
                  metadata: dict[str, Any] | None = None, healthy: bool = True, **fields: Any) -> str:
        """Register ``agent`` as an instance of capability ``name``; by default heartbeat it and
        wait until the router sees it healthy."""
        agent_id = agent_id or getattr(agent, "name", f"slow-{agent.port}")
        protocol = getattr(agent, "protocol", "rest")
        await self.register(agent_id, [capability(name, agent.endpoint, protocol, **fields)], metadata)
        if healthy:
            await self.heartbeat(agent_id)
            await self.until_state(agent_id)
        return agent_id

    async def add_all(self, agents: list[Agent], name: str = "echo", **fields: Any) -> None:
        """Register every agent, then make them all healthy at once (one wait, not one per agent)."""
        for agent in agents:
            await self.add(agent, name, healthy=False, **fields)
        await self.ready(*(agent.name for agent in agents))

    async def ready(self, *agent_ids: str) -> None:
        """Heartbeat the instances and wait until the router sees every one of them healthy."""
        await self.heartbeat(*agent_ids)
        for agent_id in agent_ids:
            await self.until_state(agent_id)

    async def deregister(self, agent_id: str) -> None:
        async with self.http.post(f"{self.registry.url}/deregister", json={"agent_id": agent_id},
                                  headers=self.admin) as response:
            assert response.status == 200, await response.text()

    async def heartbeat(self, *agent_ids: str, load: float = 0.0) -> None:
        for agent_id in agent_ids:
            async with self.http.post(f"{self.registry.url}/heartbeat", json={"agent_id": agent_id, "load": load},
                                      headers=self.admin) as response:
                assert response.status == 200, await response.text()

    def keep_beating(self, agent_id: str, every: float = 0.1) -> None:
        """Heartbeat ``agent_id`` in the background until ``stop_beating``."""
        async def beat() -> None:
            while True:
                await self.heartbeat(agent_id)
                await asyncio.sleep(every)
        self._beating[agent_id] = asyncio.create_task(beat())

    def stop_beating(self, agent_id: str) -> None:
        self._beating.pop(agent_id).cancel()

    async def until_state(self, agent_id: str, state: str = "healthy", timeout: float = 5.0) -> None:
        def seen() -> bool:
            current = self.router.mirror.states.get(agent_id)
            return agent_id in self.router.mirror.instances and current is not None and current.state == state
        await wait_for(seen, timeout=timeout, what=f"the router to see {agent_id} {state}")

    async def put_policy(self, name: str, body: dict[str, Any]) -> Policy:
        async with self.http.put(f"{self.registry.url}/policies/{name}", json=body, headers=self.admin) as response:
            assert response.status == 200, await response.text()
            stored = msgspec.convert(await response.json(), Policy)
        await wait_for(lambda: self.router.mirror.policy(name) == stored, timeout=5,
                       what=f"the router to apply the policy of {name}")
        return stored

    async def new_client(self, grants: list[str], trust_level: str = "internal", name: str = "caller",
                         **fields: Any) -> dict[str, Any]:
        """Create a client through the registry's admin API; returns its secrets once the router knows it."""
        body = {"name": name, "trust_level": trust_level, "grants": grants, **fields}
        async with self.http.post(f"{self.registry.url}/clients", json=body, headers=self.admin) as response:
            assert response.status == 201, await response.text()
            secrets = await response.json()
        await wait_for(lambda: self.router.mirror.auth.client_by_api_key(secrets["api_key"]) is not None, timeout=5,
                       what=f"the router to learn client {secrets['client_id']}")
        return secrets

    async def client_action(self, client_id: str, action: str) -> dict[str, Any]:
        """POST /clients/{id}/disable|enable|rotate on the registry, then wait until the router has the change."""
        before = self.router.mirror.auth.clients[client_id]
        async with self.http.post(f"{self.registry.url}/clients/{client_id}/{action}", headers=self.admin) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
        await wait_for(lambda: self.router.mirror.auth.clients[client_id] is not before, timeout=5,
                       what=f"the router to see client {client_id} {action}d")
        return answer

    async def post(self, body: Any, *, raw: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.http.post(f"{self.url}/atp", data=data,
                                  headers={"Content-Type": "application/json", **(headers or {})}) as response:
            text = await response.read()
            decoded = json.loads(text) if text else None
            return Answer(response.status, decoded, CIMultiDict(response.headers))

    async def call(self, name: str = "echo", payload: Any = None, *, headers: dict[str, str] | None = None,
                   **frame: Any) -> Answer:
        return await self.post({"capability": name, "payload": payload, **frame}, headers=headers)

    async def get(self, path: str) -> Any:
        async with self.http.get(f"{self.url}{path}", headers=self.admin) as response:
            assert response.status == 200, await response.text()
            if response.content_type == "application/json":
                return await response.json()
            return await response.text()

    async def reach_totals(self, name: str = "echo") -> dict[str, Any]:
        """The capability's counts from GET /reach summed over its periods (a test may straddle a
        period boundary), with the rates recomputed from the sums."""
        periods = (await self.get(f"/reach?capability={name}"))["periods"]
        totals: dict[str, Any] = {key: sum(p[key] for p in periods)
                                  for key in ("total", "success", "degraded", "failed")}
        by_code: Counter[str] = Counter()
        for period in periods:
            by_code.update(period["failed_by_code"])
        totals["failed_by_code"] = dict(by_code)
        if totals["total"]:
            totals["raw_success_rate"] = totals["success"] / totals["total"]
            totals["reach_rate"] = (totals["success"] + totals["degraded"]) / totals["total"]
        return totals

    async def close(self) -> None:
        for task in self._beating.values():
            task.cancel()
        await self.router_server.stop()


StartMesh = Callable[..., Awaitable[Mesh]]

# Lifecycle knobs for tests: nobody goes silent or gets probed unless a test asks for it.
QUIET_LIFECYCLE = {"silence_timeout": 30.0, "health_interval": 30.0, "evict_after": 3}


@contextlib.asynccontextmanager
async def meshes(start_registry: Callable[..., Awaitable[RegistryServer]],
                 http: aiohttp.ClientSession) -> AsyncIterator[StartMesh]:
    """Start a registry and a router following it: ``follow="hub"`` (in process, as `agentreach up`)
    or ``follow="http"`` (over `GET /watch`, as `agentreach router --registry URL`). Authentication is
    off unless ``auth=True`` (registry and router both); ``router_settings`` sets other router fields.
    Every router stops when the block ends (the ``start_mesh`` fixture, and benches outside pytest)."""
    started: list[Mesh] = []

    async def start(follow: str = "hub", routing: RouterSettings = RouterSettings(),
                    registry: RegistryServer | None = None, max_body: int = DEFAULT_MAX_BODY, auth: bool = False,
                    router_settings: dict[str, Any] | None = None, **lifecycle: Any) -> Mesh:
        if registry is None:
            registry = await start_registry(**{**QUIET_LIFECYCLE, **lifecycle}, auth=auth)
        admin_key = read_admin_key(registry.settings.data_dir) if auth else None
        settings = RouterServerSettings(port=0, routing=routing, max_body=max_body, auth=auth,
                                        registry_url=registry.url if follow == "http" else None,
                                        registry_key=admin_key, **(router_settings or {}))
        router = RouterServer(settings, hub=registry.hub if follow == "hub" else None)
        await router.start()
        mesh = Mesh(registry, router, http, admin_key)
        started.append(mesh)
        await wait_for(lambda: router.mirror.synced, timeout=5, what="the router to load the registry")
        return mesh

    try:
        yield start
    finally:
        for mesh in started:
            await mesh.close()


@pytest.fixture
async def start_mesh(start_registry: Callable[..., Awaitable[RegistryServer]],
                     http: aiohttp.ClientSession) -> AsyncIterator[StartMesh]:
    """``meshes`` for a test: every router stops at teardown."""
    async with meshes(start_registry, http) as start:
        yield start


@pytest.fixture
async def mesh(start_mesh: StartMesh) -> Mesh:
    return await start_mesh()


async def run_load(call: Callable[[], Awaitable[Answer]], *, until: Callable[[], bool],
                   concurrency: int = 4, limit: float = 15.0) -> list[tuple[float, Answer]]:
    """Call continuously from ``concurrency`` workers until ``until()`` holds (bounded by ``limit``
    seconds); returns (monotonic start time, answer) for every call."""
    answers: list[tuple[float, Answer]] = []
    deadline = time.monotonic() + limit

    async def worker() -> None:
        while not until() and time.monotonic() < deadline:
            started = time.monotonic()
            answers.append((started, await call()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


@pytest.fixture
async def secure(start_mesh: StartMesh, start_agent: Callable[..., Awaitable[Agent]]) -> tuple[Mesh, Agent]:
    """A mesh with authentication on and one rest agent serving `echo`."""
    mesh = await start_mesh(auth=True)
    agent = await start_agent("echo-1")
    await mesh.add(agent, "echo")
    return mesh, agent
