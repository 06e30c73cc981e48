"""Shared fixtures: real registries and real agents on 127.0.0.1, and waiting with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from port_shard import PORT_SHARD, PORT_SHARD_ENV
from recording_support import Received, RecordingServer
from registry.lifecycle import LifecycleConfig
from registry.server import RegistryServer, RegistrySettings

# The support modules that define fixtures: every test asks for them by parameter name, none imports
# them. Modules holding only plain helpers (doc_support, hardening_support, storage_support) are
# imported where used.
pytest_plugins = ["agent_support", "router_support", "log_support", "sdk_support", "console_support", "wal_support",
                  "etcd_support", "failure_support", "node_support", "socket_support", "grpc_support",
                  "mq_support", "embed_model_support"]


def pytest_configure(config: pytest.Config) -> None:
    """Children of this test process (the Go SDK's tests) choose ports in its shard (port_shard.py)."""
    os.environ[PORT_SHARD_ENV] = f"{PORT_SHARD[0]}/{PORT_SHARD[1]}"


async def wait_for(condition: Callable[[], Awaitable[Any] | Any], timeout: float = 10.0,
                   interval: float = 0.02, what: str = "condition") -> Any:
    """Poll until ``condition`` returns something truthy; fail loudly at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def loop_turns_during(work: Awaitable[Any]) -> tuple[Any, int]:
    """``work``'s result, and how many times the event loop turned while it ran (about none for work that
    blocks the loop, many for work handed to a thread)."""
    turns = 0

    async def turn() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    turning = asyncio.create_task(turn())
    try:
        return await work, turns
    finally:
        turning.cancel()


async def not_found(request: web.Request, received: Received) -> web.Response:
    return web.json_response({"error": "not_found"}, status=404)


class FakeAgent(RecordingServer):
    """An agent that is only its /healthz (``healthy`` switches it between passing and failing)."""

    def __init__(self) -> None:
        super().__init__(not_found)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@contextlib.asynccontextmanager
async def registries(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[RegistryServer]]]:
    """Start real registries on an ephemeral port, their data under ``tmp_path``; each stops when the block ends
    (the ``start_registry`` fixture, and benches that run outside pytest)."""
    servers: list[RegistryServer] = []

    async def start(data_dir: Path | None = None, **knobs: Any) -> RegistryServer:
        snapshot_every = knobs.pop("snapshot_every", 50_000)
        max_body = knobs.pop("max_body", 1024 * 1024)
        auth = knobs.pop("auth", False)
        agent_networks = knobs.pop("agent_networks", ())
        settings = RegistrySettings(data_dir=data_dir or tmp_path / "data", port=0,
                                    lifecycle=LifecycleConfig(**knobs), snapshot_every=snapshot_every,
                                    max_body=max_body, auth=auth, agent_networks=agent_networks)
        server = RegistryServer(settings)
        await server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()


@pytest.fixture
async def start_registry(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[RegistryServer]]]:
    """Start real registries on an ephemeral port; each stops at teardown."""
    async with registries(tmp_path) as start:
        yield start


@pytest.fixture
async def registry(start_registry: Callable[..., Awaitable[RegistryServer]]) -> RegistryServer:
    return await start_registry()


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    fake = FakeAgent()
    await fake.start()
    yield fake
    await fake.stop()


def registration(agent_id: str, *capabilities: str, service: str | None = None, base_url: str = "http://127.0.0.1:9",
                 **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "capabilities": [{"name": name, "version": "1.0", "protocol": "rest", "endpoint": f"/{name}",
                          "timeout_sla_ms": 5000, "max_payload_bytes": 1048576} for name in capabilities],
        "base_url": base_url,
        "metadata": {"zone": "test", "model": "m", "max_qps": 10, "semver": "1.0.0"},
    }
    if service is not None:
        body["service"] = service
    body.update(extra)
    return body


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as response:
        return response.status, await response.json()


async def call(http: aiohttp.ClientSession, method: str, url: str, key: str | None = None,
               body: Any = None) -> tuple[int, Any]:
    """One request, with ``key`` as the X-API-Key when given."""
    headers = {"X-API-Key": key} if key else {}
    async with http.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.json()


def admin_key(server: RegistryServer) -> str:
    """The admin key a registry with auth on made at its first start."""
    assert server.new_admin_key is not None
    return server.new_admin_key
