"""examples/mq_agent.py run as a newcomer runs it, against a real redis-server and the mesh's own commands as
child processes: `agentreach up --broker` (auth on, calls signed over the broker) and `agentreach registry` with
`agentreach router --broker`; and `--broker` values no router can use refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import wait_for
from mq_support import RedisServer
from sdk_support import ROOT, free_port, read_log_until, spawn_example, wait_state
from stream_support import read_stream

STREAM = "agentreach.mq-echo.demo.mq.echo"


@contextmanager
def mesh_command(tmp_path: Path, name: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`agentreach ARGS` in ``tmp_path``, its log in ``name``.log, terminated (then killed) at the end."""
    with (tmp_path / f"{name}.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "agentreach.cli", *args], cwd=tmp_path, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def until_up(http: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes]) -> None:
    async def up() -> bool:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            async with http.get(f"{url}/healthz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await wait_for(up, timeout=30, what=f"{url}/healthz")


@asynccontextmanager
async def mq_example(registry: str, broker: str, agent_id: str, token: str | None = None,
                     ) -> AsyncIterator[asyncio.subprocess.Process]:
    """examples/mq_agent.py consuming from ``broker``; killed at the end if it did not exit."""
    process = await spawn_example("mq_agent.py", "--registry", registry, "--broker", broker, "--port", "0",
                                  "--agent-id", agent_id, "--heartbeat-interval", "0.2",
                                  *(("--token", token) if token else ()))
    try:
        await read_log_until(process, "mq consumer started", timeout=20)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def atp(http: aiohttp.ClientSession, router: str, payload: Any, key: str | None = None) -> dict[str, Any]:
    headers = {"X-API-Key": key} if key else {}
    async with http.post(f"{router}/atp", json={"capability": "demo.mq.echo", "payload": payload},
                         headers=headers) as response:
        answer: dict[str, Any] = await response.json()
        assert response.status == 200, answer
        return answer


async def stops_on_sigterm(process: asyncio.subprocess.Process, http: aiohttp.ClientSession, registry: str,
                           agent_id: str, admin: str | None = None) -> None:
    """SIGTERM: deregistered, then a clean exit."""
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 15) == 0
    headers = {"X-API-Key": admin} if admin else {}
    async with http.get(f"{registry}/agents/{agent_id}", headers=headers) as response:
        assert response.status == 404, await response.text()


async def test_the_mq_example_answers_through_agentreach_router_with_a_broker(tmp_path, http, redis_server):
    registry_port = free_port()
    registry = f"http://127.0.0.1:{registry_port}"
    with mesh_command(tmp_path, "registry", "registry", "--port", str(registry_port), "--auth", "off",
                      "--data-dir", str(tmp_path / "registry")) as registry_process:
        await until_up(http, registry, registry_process)
        router_port = free_port()
        router = f"http://127.0.0.1:{router_port}"
        with mesh_command(tmp_path, "router", "router", "--port", str(router_port), "--registry", registry,
                          "--auth", "off", "--no-audit", "--data-dir", str(tmp_path / "router"),
                          "--broker", redis_server.url) as router_process:
            await until_up(http, router, router_process)
            async with mq_example(registry, redis_server.url, "mq-example-1") as agent:
                view = await wait_state(http, registry, "mq-example-1", "healthy", timeout=20)
                [registered] = view["capabilities"]
                assert (registered["protocol"], registered["endpoint"]) == ("mq", f"{redis_server.url}/{STREAM}")

                async def answered() -> dict[str, Any] | None:
                    async with http.post(f"{router}/atp", json={"capability": "demo.mq.echo",
                                                                "payload": {"text": "hi"}}) as response:
                        return await response.json() if response.status == 200 else None

                answer = await wait_for(answered, timeout=10, what="the router to learn of demo.mq.echo")
                assert answer["result"]["echo"] == {"text": "hi"}
                assert answer["result"]["served_by"] == "mq-example-1"
                assert answer["route"]["instance"] == "mq-example-1"
                answers = await asyncio.gather(*(atp(http, router, {"text": f"call {n}"}) for n in range(20)))
                assert [a["result"]["echo"]["text"] for a in answers] == [f"call {n}" for n in range(20)]
                streamed = await read_stream(http, f"{router}/atp", {"capability": "demo.mq.echo",
                                                                     "payload": {"text": "one two three"}})
                words, last = streamed.chunks[:-1], streamed.chunks[-1]["data"]
                assert [chunk["data"] for chunk in words] == [{"word": "one", "n": 0}, {"word": "two", "n": 1}]
                assert last["echo"] == {"text": "one two three"} and streamed.final[1]["result"] == last
                # Every call went through the broker's stream, and every one was acknowledged.
                assert await redis_server.client.exists(STREAM) == 1
                await redis_server.until_acknowledged(STREAM)
                await stops_on_sigterm(agent, http, registry, "mq-example-1")


async def test_the_mq_example_answers_signed_calls_through_agentreach_up_with_a_broker(tmp_path, http,
                                                                                       redis_server: RedisServer):
    """The default mesh (auth on) and the example's docstring steps: the router signs what it appends for the
    token's instances, and the agent verifies it."""
    ports = {name: free_port() for name in ("registry", "router", "console")}
    registry, router = (f"http://127.0.0.1:{ports[name]}" for name in ("registry", "router"))
    with mesh_command(tmp_path, "up", "up", "--registry-port", str(ports["registry"]),
                      "--router-port", str(ports["router"]), "--console-port", str(ports["console"]),
                      "--broker", redis_server.url) as up:
        await until_up(http, router, up)
        admin = (tmp_path / ".agentreach" / "admin.key").read_text().strip()
        token = json.loads(await cli(tmp_path, "tokens", "create", "--service", "mq-echo", "--registry", registry))
        api_key = json.loads(await cli(tmp_path, "clients", "create", "--name", "me", "--trust", "internal",
                                       "--grant", "demo.mq.*", "--registry", registry))["api_key"]
        async with mq_example(registry, redis_server.url, "mq-signed-1", token["token"]) as agent:
            async def healthy() -> bool:
                async with http.get(f"{registry}/agents/mq-signed-1", headers={"X-API-Key": admin}) as response:
                    return response.status == 200 and (await response.json())["state"] == "healthy"

            await wait_for(healthy, timeout=20, what="mq-signed-1 to be healthy")
            caller = await asyncio.to_thread(
                subprocess.run, [sys.executable, str(ROOT / "examples" / "caller.py"), "demo.mq.echo",
                                 '{"text": "hello over a broker"}', "--router", router, "--api-key", api_key],
                capture_output=True, text=True, timeout=30, cwd=tmp_path)
            assert caller.returncode == 0, caller.stdout + caller.stderr
            printed = json.loads(caller.stdout)
            assert printed["result"]["echo"] == {"text": "hello over a broker"}
            assert printed["route"]["instance"] == "mq-signed-1"
            async with http.post(f"{router}/atp", json={"capability": "demo.mq.echo", "payload": {"text": "x"}},
                                 headers={"X-API-Key": api_key}) as response:
                assert response.status == 200, await response.text()
            # Both calls verified and were served: none refused (dead-lettered), none left pending.
            assert await redis_server.dead_letters(STREAM) == []
            await redis_server.until_acknowledged(STREAM)
            await stops_on_sigterm(agent, http, registry, "mq-signed-1", admin)


async def cli(cwd: Path, *args: str) -> str:
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentreach.cli", *args],
                                   capture_output=True, text=True, timeout=60, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", ["up", "router"])
@pytest.mark.parametrize("value", ["http://127.0.0.1:6379", "redis://", "redis://127.0.0.1:6379/stream", "::"])
def test_a_broker_no_router_can_use_is_a_usage_error_naming_the_flag(command, value, tmp_path):
    refused = subprocess.run([sys.executable, "-m", "agentreach.cli", command, "--broker", value],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "argument --broker:" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr

