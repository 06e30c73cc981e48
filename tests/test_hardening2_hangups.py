"""Callers that hang up mid-request (issue 25 item 5): an expected event, not a bug. No 500 is attempted
and no traceback logged; one line per interval says how many left, and each server's /metrics counts them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from agent_reach.admission import Limits
from agent_reach.connections import GuardedSite
from agent_reach.registration import AgentRef
from aiohttp import web

from conftest import wait_for
from console_support import Rig
from hardening_support import guarded, slow_connection
from registry.api import registry_errors
from weblayer.reading import read_json

HANG_UPS = 30
# A body begun and never finished: the server is reading it when the caller leaves.
PARTIAL_POST = (b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                b'{"agent_id": "a')


async def mesh_read(request: web.Request) -> web.Response:
    """How the registry, router and console read a body: weblayer's decoder behind their error middleware."""
    ref = await read_json(request, AgentRef)
    return web.json_response({"agent_id": ref.agent_id})


async def agent_read(request: web.Request) -> web.Response:
    """How an SDK agent's handler reads one: aiohttp's own read, no middleware around it."""
    return web.json_response({"bytes": len(await request.read())})


@contextlib.asynccontextmanager
async def serving(read: Callable[[web.Request], Awaitable[web.Response]], middlewares: list[Any],
                  reading: list[str], done: list[str]) -> AsyncIterator[tuple[int, GuardedSite]]:
    """A server whose handler notes when it starts reading a body and when it is over."""

    async def handler(request: web.Request) -> web.Response:
        reading.append(request.path)
        try:
            return await read(request)
        finally:
            done.append(request.path)

    app = web.Application(middlewares=middlewares)
    app.router.add_post("/read", handler)
    async with guarded(app, Limits(body_timeout=60)) as served:
        yield served


def reset(writer: asyncio.StreamWriter) -> None:
    """Leave as a crashed or impatient client does: a TCP reset, nothing more read or sent."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize(("read", "middlewares"), [(mesh_read, [registry_errors]), (agent_read, [])],
                         ids=["mesh-weblayer", "sdk-agent"])
async def test_callers_resetting_mid_body_are_one_throttled_line_and_a_count(read, middlewares, caplog):
    reading: list[str] = []
    done: list[str] = []
    caplog.set_level(logging.INFO)
    async with serving(read, middlewares, reading, done) as (port, site):
        writers = [(await slow_connection(port, PARTIAL_POST))[1] for _ in range(HANG_UPS)]
        await wait_for(lambda: len(reading) == HANG_UPS, timeout=10, what="every handler to be reading its body")
        for writer in writers:
            reset(writer)
        await wait_for(lambda: len(done) == HANG_UPS and site.gate.open == 0, timeout=10,
                       what="every handler to end and every connection to close")
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert tracebacks == [], [record.getMessage() for record in tracebacks[:3]]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    left = [record for record in caplog.records if record.getMessage() == "callers left mid-request"]
    # The first is reported at once; the rest wait for the next report, 10 s on.
    assert len(left) == 1 and left[0].events == 1 and left[0].levelno == logging.INFO
    assert site.gate.hang_ups == HANG_UPS


async def test_a_caller_closing_mid_header_is_counted_and_one_answered_is_not(http):
    async with serving(agent_read, [], [], []) as (port, site):
        _, writer = await slow_connection(port, b"POST /read HTTP/1.1\r\nHost: x\r\n")
        await wait_for(lambda: site.gate.open == 1, timeout=5, what="the connection to be open")
        writer.close()
        await wait_for(lambda: site.gate.open == 0, timeout=5, what="the connection to close")
        async with http.post(f"http://127.0.0.1:{port}/read", data=b"{}", headers={"Connection": "close"}) as answer:
            assert answer.status == 200
        await wait_for(lambda: site.gate.open == 0, timeout=5, what="the answered connection to close")
        # Nor one opened and closed without a byte (a port probe, a pool's spare).
        _, writer = await slow_connection(port, b"")
        await wait_for(lambda: site.gate.open == 1, timeout=5, what="the empty connection to be open")
        writer.close()
        await wait_for(lambda: site.gate.open == 0, timeout=5, what="the empty connection to close")
        assert site.gate.hang_ups == 1


def partial_post(path: str) -> bytes:
    return PARTIAL_POST.replace(b"/read", path.encode(), 1)


async def metric(rig: Rig, url: str, name: str) -> float | None:
    async with rig.http.get(f"{url}/metrics") as answer:
        for line in (await answer.text()).splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    return None


async def test_every_server_counts_its_hang_ups_in_its_metrics(start_rig, caplog):
    caplog.set_level(logging.INFO)
    rig = await start_rig()
    servers = {"registry": (rig.mesh.registry.url, "/register"), "router": (rig.mesh.url, "/atp"),
               "console": (rig.url, "/api/debug")}
    for part, (url, path) in servers.items():
        name = f"agentreach_{part}_caller_hangups_total"
        assert await metric(rig, url, name) == 0
        for _ in range(3):
            _, writer = await slow_connection(urlsplit(url).port, partial_post(path))
            writer.close()  # the caller leaves: its body never finished

        async def counted(url: str = url, name: str = name) -> bool:
            return await metric(rig, url, name) == 3

        await wait_for(counted, timeout=10, what=f"the {part}'s three hang-ups in its /metrics")
        assert await metric(rig, url, f"agentreach_{part}_connections_limit") > 0
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    # One line for each server's first hang-up; the next two wait for the next report.
    assert len([r for r in caplog.records if r.getMessage() == "callers left mid-request"]) == len(servers)
