"""Servers that survive slow, hostile and exhausted conditions: slowloris headers and bodies are
timed out, a connection cap keeps descriptors for the process's own work, exhaustion is logged
once per interval, and a registry out of descriptors does not evict the instances it cannot probe."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from agent_reach.admission import Limits
from agent_reach.connections import GuardedSite
from agent_reach.exhaustion import Throttle
from agent_reach.registration import AgentRef
from aiohttp import web

from conftest import post, registration, wait_for
from hardening_support import closed_by_server, guarded, slow_connection, trickle
from registry.api import registry_errors
from registry.cluster import SoleNode
from registry.health import HealthChecker
from weblayer.reading import read_json


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def echo(request: web.Request) -> web.Response:
    """The registry's own body path: its decoder behind its error middleware."""
    ref = await read_json(request, AgentRef)
    return web.json_response({"agent_id": ref.agent_id})


class Held:
    """Requests the server holds, unanswered, until released: connections busy with a request, not waiting on
    their client, are never closed to make room."""

    def __init__(self) -> None:
        self.waiting = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.waiting += 1
        await self.release.wait()
        return web.json_response({"held": True})


@contextlib.asynccontextmanager
async def serving(limits: Limits, held: Held | None = None) -> AsyncIterator[tuple[str, GuardedSite]]:
    app = web.Application(middlewares=[registry_errors])
    app.router.add_get("/", ok)
    app.router.add_post("/echo", echo)
    if held is not None:
        app.router.add_get("/held", held.handle)
    async with guarded(app, limits) as (port, site):
        yield f"http://127.0.0.1:{port}", site


async def test_slowloris_headers_are_closed_while_normal_requests_are_served(http):
    async with serving(Limits(header_timeout=0.5, max_connections=100)) as (url, site):
        port = int(url.rsplit(":", 1)[1])
        connections = [await slow_connection(port) for _ in range(20)]
        stop = asyncio.Event()
        dripping = asyncio.create_task(trickle([writer for _, writer in connections], stop))  # noqa: RUF006 (awaited below)
        ends = [asyncio.create_task(closed_by_server(reader)) for reader, _ in connections]
        try:
            async with http.get(url, headers={"Connection": "close"}) as response:
                assert response.status == 200 and await response.json() == {"ok": True}
            await wait_for(lambda: all(end.done() for end in ends), timeout=10,
                           what="the server to close every slow header")
            assert all(end.result() == b"" for end in ends)  # closed without an answer: nothing was asked
            await wait_for(lambda: site.gate.open == 0, timeout=5, what="the slow connections to be gone")
        finally:
            stop.set()
            await dripping
            for _, writer in connections:
                writer.close()


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline():
    async with serving(Limits(header_timeout=0.3)) as (url, _site):
        reader, writer = await slow_connection(int(url.rsplit(":", 1)[1]), b"")
        assert await asyncio.wait_for(closed_by_server(reader), 10) == b""
        writer.close()


async def test_an_idle_keep_alive_connection_is_closed_at_the_idle_deadline():
    async with serving(Limits(idle_timeout=0.3)) as (url, site):
        reader, writer = await slow_connection(int(url.rsplit(":", 1)[1]), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(closed_by_server(reader), 10)  # the answer, then the close
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"ok": true}')
        await wait_for(lambda: site.gate.open == 0, timeout=5, what="the idle connection to be gone")


async def test_a_body_that_trickles_past_its_deadline_is_a_408(http):
    async with serving(Limits(body_timeout=0.3)) as (url, _):
        reader, writer = await slow_connection(int(url.rsplit(":", 1)[1]),
                                               b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                               b"Content-Length: 100\r\n\r\n{\"agent_id\"")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(body)["error"] == "body_timeout" and json.loads(body)["field"] == "body"
        async with http.post(f"{url}/echo", json={"agent_id": "a1"}) as response:
            assert response.status == 200 and await response.json() == {"agent_id": "a1"}


async def test_the_connection_cap_refuses_the_extra_connection_with_a_503_and_recovers(http):
    handler = Held()
    async with serving(Limits(max_connections=8, header_timeout=60), handler) as (url, site):
        port = int(url.rsplit(":", 1)[1])
        held = [await slow_connection(port, b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(8)]
        await wait_for(lambda: handler.waiting == 8, timeout=5, what="eight requests being handled")
        async with http.get(url) as response:
            assert response.status == 503
            assert (await response.json())["error"] == "too_many_connections"
        # Every connection is busy with a request: none is closed to make room.
        assert site.gate.open == 8 and site.gate.refused >= 1 and site.gate.shed == 0
        held.pop()[1].close()
        await wait_for(lambda: site.gate.open < 8, timeout=5, what="a slot to free up")
        async with http.get(url) as response:
            assert response.status == 200
        handler.release.set()
        for _, writer in held:
            writer.close()


def descriptors_each_turn(seen: list[int], stop: asyncio.Event) -> None:
    """How many descriptors this process holds, noted between every two turns of its loop until ``stop``."""
    seen.append(len(os.listdir("/proc/self/fd")))
    if not stop.is_set():
        asyncio.get_running_loop().call_soon(descriptors_each_turn, seen, stop)


async def test_a_connection_past_the_cap_is_refused_as_it_is_accepted_holding_no_descriptor():
    async with serving(Limits(max_connections=4, header_timeout=60)) as (url, site):
        port = int(url.rsplit(":", 1)[1])
        before = len(os.listdir("/proc/self/fd"))
        # One more than the cap, all queued before the loop's next turn, as when a busy loop wakes to a flood.
        clients = [socket.socket() for _ in range(5)]
        for client in clients:
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
        seen: list[int] = []
        stop = asyncio.Event()
        descriptors_each_turn(seen, stop)
        streams = [await asyncio.open_connection(sock=client) for client in clients]
        ends = [asyncio.create_task(closed_by_server(reader)) for reader, _ in streams]
        try:
            await wait_for(lambda: any(end.done() for end in ends), timeout=10, what="the refusal")
            stop.set()
            # The server's side: the four it serves, never the refused one still waiting to be closed.
            assert max(seen) - before - len(clients) <= 4
            assert [end.result()[:12] for end in ends if end.done()] == [b"HTTP/1.1 503"]
            assert site.gate.open == 4 and site.gate.accepted == 0 and site.gate.refused == 1
        finally:
            for _, writer in streams:
                writer.close()

CHILD = r"""
import asyncio, resource, sys
from agent_reach import logs
from agent_reach.admission import Limits
from agent_reach.serving import listen
from aiohttp import web

resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logs.configure()

async def main():
    async def ok(request):
        return web.json_response({"ok": True})
    app = web.Application()
    app.router.add_get("/", ok)
    max_connections = int(sys.argv[2]) if len(sys.argv) > 2 else Limits().max_connections
    runner, port = await listen(app, "127.0.0.1", 0, limits=Limits(header_timeout=1.0, max_connections=max_connections))
    print(port, max_connections, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()

asyncio.run(main())
"""


@contextlib.contextmanager
def child_server(fd_limit: int, *cap: int) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(fd_limit), *map(str, cap)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port, max_connections = map(int, child.stdout.readline().split())
        yield child, port, max_connections
    finally:
        child.kill()
        child.wait()


async def flood(port: int, count: int) -> list[asyncio.Task[bytes]]:
    """``count`` slowloris connections opened at once; each task ends with what the server sent before closing."""

    async def one() -> asyncio.Task[bytes]:
        reader, writer = await slow_connection(port)
        end = asyncio.create_task(closed_by_server(reader))
        end.add_done_callback(lambda _: writer.close())
        return end

    return list(await asyncio.gather(*(one() for _ in range(count))))


def sockets_of(pid: int) -> int:
    fds = f"/proc/{pid}/fd"
    links = []
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(f"{fds}/{fd}"))
    return sum(link.startswith("socket:") for link in links)


async def most_sockets(pid: int, stop: asyncio.Event) -> int:
    most = 0
    while not stop.is_set():
        most = max(most, sockets_of(pid))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.01)
    return most


async def test_under_a_low_fd_limit_a_flood_is_capped_timed_out_and_the_server_keeps_serving(http):
    with child_server(128) as (child, port, max_connections):
        assert max_connections == 32  # a quarter of the descriptors
        idle = sockets_of(child.pid)  # the listener and the loop's own
        stop = asyncio.Event()
        watching = asyncio.create_task(most_sockets(child.pid, stop))
        ends = await flood(port, 150)
        await wait_for(lambda: all(end.done() for end in ends), timeout=20, what="every slow connection to end")
        stop.set()
        # Past the cap a connection is refused as it is accepted: at most one is in flight, however loaded.
        assert await watching <= idle + max_connections + 1
        async with http.get(f"http://127.0.0.1:{port}/") as response:
            assert response.status == 200
        assert child.poll() is None
        child.kill()
        _, errors = child.communicate()
    assert "EMFILE" not in errors and "Traceback" not in errors, errors[-2000:]
    assert sum("connection cap reached" in line for line in errors.splitlines()) >= 1


async def test_running_out_of_descriptors_is_logged_once_per_interval_without_tracebacks(http):
    # A cap above the fd limit: accept() itself hits EMFILE, which asyncio reports every second.
    with child_server(64, 1000) as (child, port, _):
        ends = await flood(port, 120)
        await wait_for(lambda: all(end.done() for end in ends), timeout=20, what="every slow connection to end")
        async with http.get(f"http://127.0.0.1:{port}/") as response:
            assert response.status == 200
        child.kill()
        _, errors = child.communicate()
    exhausted = [json.loads(line) for line in errors.splitlines() if "out of a system resource" in line]
    assert len(exhausted) == 1, errors[-3000:]
    assert exhausted[0]["errno"] == "EMFILE" and exhausted[0]["events"] >= 1
    assert "Traceback" not in errors


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Make every new descriptor in this process fail with EMFILE, then put things back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        with pytest.raises(OSError, match="Too many open files"):
            os.open(os.devnull, os.O_RDONLY)
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_registry_out_of_descriptors_does_not_evict_the_agent_it_cannot_probe(start_registry, http, agent,
                                                                                     caplog):
    registry = await start_registry(silence_timeout=0.05, health_interval=3600, evict_after=1)
    status, _ = await post(http, f"{registry.url}/register",
                           registration("a1", "probe.cap", base_url=agent.url, health_url=f"{agent.url}/healthz"))
    assert status == 200
    checker = HealthChecker(registry.registry, http, SoleNode(registry.registry, None, url=""))
    await wait_for(lambda: registry.registry.agent("a1").state == "demoted", timeout=5, what="a1 to go silent")
    with caplog.at_level(logging.ERROR, logger="agentreach.registry.health"), descriptors_exhausted():
        for _ in range(3):
            plan = await checker.sweep()
            assert plan.evict == []
    assert registry.registry.agent("a1").state == "demoted"
    assert checker.checks["unprobed"] == 3 and checker.checks["fail"] == 0
    assert sum("could not be sent" in record.getMessage() for record in caplog.records) == 1
    await checker.sweep()
    assert checker.checks["pass"] == 1 and agent.health_checks == 1
    assert registry.registry.agent("a1").state != "evicted"


def test_a_throttle_reports_the_first_event_then_one_summary_per_interval():
    now = [0.0]
    throttle = Throttle(interval=10.0, clock=lambda: now[0])
    assert throttle.event() == 1
    assert [throttle.event() for _ in range(5)] == [0] * 5
    now[0] = 10.0
    assert throttle.event(2) == 7  # the five held back, and these two
    assert throttle.event() == 0
