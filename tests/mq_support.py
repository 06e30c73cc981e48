"""A real redis-server for mq tests: started on a free 127.0.0.1 port with its files in a temp dir, stopped at
teardown; a raw client to look into its streams as a test needs (pending entries, dead letters); an SDK mq agent
run as a child process, to be killed holding a call (``python tests/mq_support.py --help``); a mesh whose agents
join with registration tokens and whose router reaches the broker."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from agent_reach import AgentReachSDK, logs
from agent_reach.mq_wire import GROUP

from conftest import wait_for
from registry.server import RegistryServer
from router.server import RouterServer, RouterServerSettings
from sdk_support import TokenMesh, free_port


class RedisServer:
    def __init__(self, process: asyncio.subprocess.Process, port: int):
        self.process = process
        self.port = port
        self.url = f"redis://127.0.0.1:{port}"
        self.client = aioredis.Redis.from_url(self.url)

    async def pending(self, stream: str) -> list[dict[str, object]]:
        """The stream's entries taken and not yet acknowledged, with who holds each and how often delivered."""
        return list(await self.client.xpending_range(stream, GROUP, "-", "+", 100))

    async def until_acknowledged(self, stream: str, what: str = "every entry", timeout: float = 5.0) -> None:
        """Wait until nothing of ``stream`` is pending: an agent answers a call, then acknowledges its entry, so a
        caller may hold the answer a moment before the entry leaves the pending list."""
        async def settled() -> bool:
            return await self.pending(stream) == []
        await wait_for(settled, timeout=timeout, what=f"{what} of {stream} to be acknowledged")

    async def dead_letters(self, stream: str) -> list[dict[bytes, bytes]]:
        return [fields for _, fields in await self.client.xrange(f"{stream}.dead")]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP the server for the block, SIGCONT after it even when the block fails: its sockets stay open
        and take what is written to them, but nothing is answered (a hung broker, not a dead one)."""
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)


async def _answers(client: aioredis.Redis) -> bool:
    with contextlib.suppress(OSError, aioredis.ConnectionError):
        return bool(await client.ping())
    return False


@contextlib.asynccontextmanager
async def running_redis(directory: Path) -> AsyncIterator[RedisServer]:
    """redis-server on loopback, no persistence, until the block ends (the fixture, and the bench)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is missing: run scripts/install-test-tools"
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--save", "",
        "--appendonly", "no", "--protected-mode", "yes", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    server = RedisServer(process, port)
    try:
        await wait_for(lambda: _answers(server.client), timeout=10, what="redis-server to answer PING")
        yield server
    finally:
        await server.client.aclose()
        if process.returncode is None:
            process.terminate()
        await process.wait()


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with running_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def mq_token_mesh(start_registry: Callable[..., Awaitable[RegistryServer]], http: aiohttp.ClientSession,
                        redis_server: RedisServer) -> AsyncIterator[TokenMesh]:
    """sdk_support's token_mesh with a router reaching ``redis_server``: it signs what it forwards to a token's
    instances (caller auth off)."""
    registry = await start_registry(auth=True, silence_timeout=30.0, health_interval=30.0)
    router = RouterServer(RouterServerSettings(port=0, auth=False, broker=redis_server.url), hub=registry.hub)
    await router.start()
    await wait_for(lambda: router.mirror.synced, what="the router to load the registry")
    yield TokenMesh(registry=registry, router=router, http=http)
    await router.stop()


class MqAgentProcess:
    """An SDK mq agent in a child process (this module's ``main``): its JSON log lines as they come, SIGKILL."""

    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process
        self.lines: list[dict[str, Any]] = []
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        """Read every line, so a chatty child never blocks on a full pipe."""
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == event]

    async def until_logged(self, event: str, timeout: float = 15.0) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            assert self.process.returncode is None or self.logged(event), f"the agent exited before {event!r}"
            return next(iter(self.logged(event)), None)

        return await wait_for(seen, timeout=timeout, what=f"the agent to log {event!r}")

    async def kill(self) -> None:
        """kill -9: the calls it holds stay pending in the group, unanswered."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        await self._reading


StartMqAgent = Callable[..., Awaitable[MqAgentProcess]]


@pytest.fixture
async def mq_agent_process() -> AsyncIterator[StartMqAgent]:
    """``await mq_agent_process(registry, broker, agent_id, *flags)``: this module's agent, consuming once it
    logged so; every one is killed at teardown."""
    started: list[MqAgentProcess] = []

    async def start(registry: str, broker: str, agent_id: str, *flags: str) -> MqAgentProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--registry", registry, "--broker", broker, "--agent-id", agent_id, *flags,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started.append(MqAgentProcess(process))
        await started[-1].until_logged("mq consumer started")
        return started[-1]

    try:
        yield start
    finally:
        for agent in started:
            await agent.kill()


def build(args: argparse.Namespace) -> AgentReachSDK:
    """An agent serving ``args.capability`` over mq: "hold" blocks until the process dies, "poison" kills the
    process (each instance taking it dies), anything else is echoed with who served it."""
    sdk = AgentReachSDK(agent_id=args.agent_id, registry_url=args.registry, zone="test", service=args.service,
                        heartbeat_interval=0.2, broker=args.broker, mq_visibility_s=args.visibility_s,
                        mq_max_deliveries=args.max_deliveries)
    log = logging.getLogger("agentreach.test")

    @sdk.capability(args.capability, protocol="mq", idempotent=args.idempotent)
    async def serve(payload: Any, ctx: Any) -> Any:
        if payload == "poison":
            log.warning("mq_test_poisoned", extra={"request_id": ctx.request_id})
            os.kill(os.getpid(), signal.SIGKILL)
        if payload == "hold":
            log.warning("mq_test_holding", extra={"request_id": ctx.request_id})
            await asyncio.Event().wait()
        return {"echo": payload, "served_by": args.agent_id}

    return sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=build.__doc__)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--service", default="mq-child")
    parser.add_argument("--capability", default="mq.child")
    parser.add_argument("--visibility-s", type=float, default=1.0)
    parser.add_argument("--max-deliveries", type=int, default=3)
    parser.add_argument("--idempotent", action="store_true")
    args = parser.parse_args()
    logs.configure()
    build(args).serve("127.0.0.1", 0)


if __name__ == "__main__":
    main()
