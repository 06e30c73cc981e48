"""The router's own failures are its own: out of file descriptors, it answers INTERNAL_ERROR, opens no
breaker, ejects no instance, fails over nowhere and says so once per interval; once descriptors return,
calls go through. An agent cannot pass its failure off as the router's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from agent_support import Agent
from conftest import wait_for
from router_support import capability

AGENTS = ("fd-1", "fd-2")
# One counted failure would open every breaker: a call the router could not send must count for none.
TOUCHY = {"circuit_breaker": {"min_requests": 1, "error_threshold_percent": 1, "reset_seconds": 3600}}

# A real router (following the registry over HTTP) in a process of its own with 128 descriptors. Commands
# on stdin, one JSON answer each on stdout: `exhaust` takes every descriptor left (the next socket the
# router opens fails with EMFILE), `restore` gives them back, `state ID...` is what the router knows of
# those instances: how it sees them, its breakers, its ejections.
CHILD = r"""
import asyncio, json, os, resource, sys, time
from agent_reach import logs
from router.server import RouterServer, RouterServerSettings

resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logs.configure()


def exhaust():
    held = []
    while True:
        try:
            held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            return held


def state(router, agent_ids):
    now = time.monotonic()
    return {"seen": {a: router.mirror.states[a].state for a in agent_ids
                     if a in router.mirror.instances and a in router.mirror.states},
            "breakers": {f"{scope}/{name}": breaker.state(now).value
                         for (scope, name), breaker in router.book.breakers()},
            "ejected": [a for a in agent_ids if router.book.ejected(a, now)]}


async def main():
    server = RouterServer(RouterServerSettings(port=0, registry_url=sys.argv[1], auth=False))
    await server.start()
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"port": server.port}), flush=True)
    held = []
    async for line in reader:
        command, *args = line.decode().split()
        if command == "exhaust":
            held = exhaust()
            answer = {"held": len(held)}
        elif command == "restore":
            for fd in held:
                os.close(fd)
            held, answer = [], {}
        else:
            answer = state(server.router, args)
        print(json.dumps(answer), flush=True)
    await server.stop()

asyncio.run(main())
"""


class ChildRouter:
    def __init__(self, process: asyncio.subprocess.Process, log: Path):
        self.process = process
        self.log = log
        self.port = 0

    async def ask(self, *command: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((" ".join(command) + "\n").encode())
        await self.process.stdin.drain()
        return json.loads(await asyncio.wait_for(self.process.stdout.readline(), 10))

    async def stop(self) -> list[dict[str, Any]]:
        """Let it shut down; its log lines."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), 10)
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


@contextlib.asynccontextmanager
async def child_router(registry_url: str, log: Path) -> AsyncIterator[ChildRouter]:
    with log.open("w") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, registry_url, cwd=Path(__file__).parent.parent,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr)
    child = ChildRouter(process, log)
    try:
        assert process.stdout is not None
        child.port = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))["port"]
        yield child
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def registered(http: aiohttp.ClientSession, registry_url: str, agents: list[Agent]) -> None:
    async with http.put(f"{registry_url}/policies/echo", json=TOUCHY) as response:
        assert response.status == 200, await response.text()
    for agent in agents:
        body = {"agent_id": agent.name, "service": "echo", "capabilities": [capability("echo", agent.endpoint)]}
        async with http.post(f"{registry_url}/register", json=body) as response:
            assert response.status == 200, await response.text()
        async with http.post(f"{registry_url}/heartbeat", json={"agent_id": agent.name}) as response:
            assert response.status == 200, await response.text()


async def test_a_router_out_of_descriptors_blames_no_agent_and_recovers(start_registry, start_agent, http,
                                                                         tmp_path):
    registry = await start_registry(silence_timeout=30.0, health_interval=30.0, evict_after=3)
    agents = [await start_agent(name) for name in AGENTS]
    await registered(http, registry.url, agents)
    # One connection to the router, opened before its descriptors run out: it can accept no other.
    async with child_router(registry.url, tmp_path / "router.log") as router, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(10)) as caller:
        url = f"http://127.0.0.1:{router.port}/atp"
        async with caller.get(f"http://127.0.0.1:{router.port}/healthz") as response:
            assert response.status == 200

        async def both_healthy() -> bool:
            seen = (await router.ask("state", *AGENTS))["seen"]
            return seen == dict.fromkeys(AGENTS, "healthy")
        await wait_for(both_healthy, timeout=10, what="the child router to see both instances healthy")

        async def call(n: int) -> tuple[int, dict[str, Any]]:
            async with caller.post(url, json={"capability": "echo", "payload": n}) as response:
                return response.status, await response.json()

        assert (await router.ask("exhaust"))["held"] > 0
        for n in range(3):
            status, body = await call(n)
            assert (status, body["error_code"], body["can_retry"]) == (500, "INTERNAL_ERROR", True), body
            assert "EMFILE" in body["error_message"] and body["route"].get("attempts", 0) <= 1, body
        state = await router.ask("state", *AGENTS)
        assert state["ejected"] == [] and set(state["breakers"].values()) <= {"closed"}, state
        assert [agent.calls for agent in agents] == [0, 0]

        await router.ask("restore")
        status, body = await call(3)
        assert status == 200 and body["result"]["echo"] == 3 and not body["route"].get("degraded"), body
        state = await router.ask("state", *AGENTS)
        assert state["ejected"] == [] and set(state["breakers"].values()) == {"closed"}, state
        lines = await router.stop()
    reported = [line for line in lines if line["event"].startswith("router out of")]
    assert len(reported) == 1 and reported[0]["events"] == 1 and "EMFILE" in reported[0]["error"], reported
    assert not [line for line in lines if line["event"] in ("instance ejected: connection failed", "attempt failed")]


class ClaimsRouterFault(Agent):
    """An atp agent that fails with the router's own error code."""

    def _answer(self, body: Any) -> tuple[int, Any]:
        _, frame = super()._answer(body)
        return 500, {**frame, "error_code": "INTERNAL_ERROR"}


async def test_an_agent_answering_internal_error_is_an_agent_error_and_counts(mesh):
    agent = await ClaimsRouterFault("claims-router-fault", "atp").start()
    try:
        await mesh.put_policy("echo", TOUCHY)
        await mesh.add(agent)
        first = await mesh.call("echo", 1)
        assert (first.status, first.body["error_code"]) == (502, "AGENT_ERROR"), first.body
        second = await mesh.call("echo", 2)
        assert second.body["error_code"] == "CIRCUIT_OPEN", "the agent's failure was counted"
    finally:
        await agent.stop()
