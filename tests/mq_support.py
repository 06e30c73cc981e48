"""A real redis-server for mq tests: started on a free 127.0.0.1 port with its files in a temp dir, stopped at
teardown; and a raw client to look into its streams as a test needs (pending entries, dead letters)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from agent_reach.mq_wire import GROUP

from conftest import wait_for
from sdk_support import free_port


class RedisServer:
    def __init__(self, process: asyncio.subprocess.Process, port: int):
        self.process = process
        self.port = port
        self.url = f"redis://127.0.0.1:{port}"
        self.client = aioredis.Redis.from_url(self.url)

    async def pending(self, stream: str) -> list[dict[str, object]]:
        """The stream's entries taken and not yet acknowledged, with who holds each and how often delivered."""
        return list(await self.client.xpending_range(stream, GROUP, "-", "+", 100))

    async def dead_letters(self, stream: str) -> list[dict[bytes, bytes]]:
        return [fields for _, fields in await self.client.xrange(f"{stream}.dead")]


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
