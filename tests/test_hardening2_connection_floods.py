"""Connection floods do not starve real callers (issue 25 item 8): near the cap the connections waiting on a
slow client (idle, or with a request still arriving) are closed first to make room, and one address holds
at most its share of the cap. Attackers and callers come from distinct loopback addresses (Linux routes
all of 127.0.0.0/8 to lo)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from agent_reach.admission import Admission, Limits, admission, shed_threshold
from agent_reach.connections import GuardedSite
from aiohttp import web

from agentreach.cli import build_parser
from agentreach.knobs import console_settings, registry_settings, router_settings
from conftest import wait_for
from hardening_support import PARTIAL_HEADER, closed_by_server, guarded, slow_connection
from router_support import Mesh
from sdk_support import read_log_until

ROOT = Path(__file__).resolve().parents[1]
ATTACKER, CALLER = "127.0.0.2", "127.0.0.3"
SLOW = {
    "header": PARTIAL_HEADER,
    "body": b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"half\":",
    "idle": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # answered, then kept alive and silent
    "silent": b"",
}


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def read(request: web.Request) -> web.Response:
    return web.json_response({"bytes": len(await request.read())})


def serving(limits: Limits) -> contextlib.AbstractAsyncContextManager[tuple[int, GuardedSite]]:
    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_post("/read", read)
    return guarded(app, limits)


@contextlib.asynccontextmanager
async def calling_from(source: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A caller at ``source``, each call on a new connection, as a caller arriving during the flood."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


class Flood:
    """Slow connections from ``sources``, each kept until the server closes it."""

    def __init__(self, port: int, first: bytes, sources: list[str]):
        self.port, self.first, self.sources = port, first, sources
        self.ends: list[asyncio.Task[bytes]] = []

    async def open(self, source: str) -> None:
        reader, writer = await slow_connection(self.port, self.first, source)
        end = asyncio.create_task(closed_by_server(reader))
        end.add_done_callback(lambda _: writer.close())
        self.ends.append(end)

    async def until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for source in self.sources:
                await self.open(source)

    def close(self) -> None:
        for end in self.ends:
            end.cancel()


def test_admission_refuses_past_the_cap_or_the_share_and_makes_room_from_the_threshold():
    knobs = {"limit": 10, "per_peer": 4, "shed_at": 9}
    assert admission(5, 0, 0, **knobs) == (Admission.ADMIT, False)
    assert admission(9, 0, 1, **knobs) == (Admission.ADMIT, True)
    assert admission(9, 1, 1, **knobs) == (Admission.ADMIT, False)  # the room is being made already
    assert admission(10, 0, 1, **knobs) == (Admission.FULL, True)  # refused, and room made for the retry
    assert admission(9, 0, 4, **knobs) == (Admission.PEER_FULL, False)
    assert admission(9, 0, 400, **{**knobs, "per_peer": 0}) == (Admission.ADMIT, True)
    assert [shed_threshold(limit, 0.9) for limit in (1, 8, 20, 1000)] == [0, 7, 18, 900]


@pytest.mark.parametrize("kind", list(SLOW))
async def test_slow_connections_from_one_address_do_not_starve_a_caller_from_another(kind, caplog):
    caplog.set_level(logging.INFO)
    limits = Limits(max_connections=20, max_connections_per_peer=0, header_timeout=60, body_timeout=60,
                    idle_timeout=60)
    async with serving(limits) as (port, site):
        flood = Flood(port, SLOW[kind], [ATTACKER])
        try:
            for _ in range(60):
                await flood.open(ATTACKER)
                assert site.gate.open + site.gate.accepted <= 20  # the cap still holds
            await wait_for(lambda: sum(end.done() for end in flood.ends) >= 40, timeout=10,
                           what="the oldest slow connections to be closed for room")
            async with calling_from(CALLER) as caller:
                for _ in range(10):
                    async with caller.get(f"http://127.0.0.1:{port}/") as answer:
                        assert answer.status == 200
            assert site.gate.shed >= 40 and site.gate.refused == 0
            # The newest slow connections are the ones kept.
            assert not any(end.done() for end in flood.ends[-10:])
        finally:
            flood.close()
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    shed = [record for record in caplog.records if record.getMessage().startswith("slow connections closed")]
    assert len(shed) == 1 and shed[0].events == 1  # the rest wait for the next report, 10 s on


async def test_an_address_past_its_share_is_refused_while_another_still_gets_in():
    async with serving(Limits(max_connections=100, max_connections_per_peer=5, header_timeout=60)) as (port, site):
        held = [await slow_connection(port, source=ATTACKER) for _ in range(5)]
        await wait_for(lambda: site.gate.open == 5, timeout=5, what="five connections from the attacker")
        reader, writer = await slow_connection(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ATTACKER)
        refused = await asyncio.wait_for(closed_by_server(reader), 10)
        writer.close()
        head, _, body = refused.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), refused
        assert json.loads(body)["error"] == "too_many_connections" and "address" in json.loads(body)["message"]
        assert site.gate.refused_peer == 1 and site.gate.refused == 0
        async with calling_from(CALLER) as caller, caller.get(f"http://127.0.0.1:{port}/") as answer:
            assert answer.status == 200
        held.pop()[1].close()
        await wait_for(lambda: site.gate.open == 4, timeout=5, what="one of the attacker's to close")
        async with calling_from(ATTACKER) as attacker, attacker.get(f"http://127.0.0.1:{port}/") as answer:
            assert answer.status == 200  # back under its share
        for _, writer in held:
            writer.close()


async def metric(mesh: Mesh, name: str) -> float:
    text = await mesh.get("/metrics")
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_a_router_under_a_slow_flood_from_many_addresses_answers_every_call(start_mesh, start_agent):
    limits = Limits(max_connections=40, max_connections_per_peer=10, header_timeout=60)
    mesh = await start_mesh(router_settings={"connections": limits})
    await mesh.add(await start_agent("echo-1"))
    # One address opens as many as the seven others together: it runs into its share, they into the cap.
    sources = [ATTACKER] * 7 + [f"127.0.0.{host}" for host in range(4, 11)]
    flood = Flood(mesh.router_server.port, PARTIAL_HEADER, sources)
    stop = asyncio.Event()
    flooding = asyncio.create_task(flood.until(stop))
    try:
        await wait_for(lambda: len(flood.ends) >= 100, timeout=10, what="the flood to be under way")
        async with calling_from(CALLER) as caller:
            for n in range(30):
                async with caller.post(f"{mesh.url}/atp", json={"capability": "echo", "payload": n}) as answer:
                    assert answer.status == 200, await answer.text()
    finally:
        stop.set()
        await flooding
        flood.close()
    assert await metric(mesh, "agentreach_router_connections_shed_total") > 0
    assert await metric(mesh, 'agentreach_router_connections_refused_total{reason="peer"}') > 0
    assert await metric(mesh, "agentreach_router_connections_open") <= 40


def settings_of(argv: list[str]) -> list[object]:
    """The settings of every server the command starts, as the command line gives them."""
    parser = build_parser()
    args = parser.parse_args([*argv, "--auth", "off"])
    parts = {"registry": lambda: registry_settings(args, 0, parser), "router": lambda: router_settings(args, 0, None),
             "console": lambda: console_settings(args, 0, "", "")}
    return [settings() for name, settings in parts.items() if argv[0] in (name, "up")]


@pytest.mark.parametrize("command", ["up", "registry", "router", "console"])
def test_every_server_takes_its_share_per_address_from_the_command_line(command):
    given = settings_of([command, "--max-connections-per-peer", "7"])
    assert [part.connections.max_connections_per_peer for part in given] == [7] * len(given)  # type: ignore[attr-defined]
    assert [part.connections for part in settings_of([command])] == [Limits()] * len(given)  # type: ignore[attr-defined]


def test_a_negative_share_per_address_is_a_usage_error():
    refused = subprocess.run([sys.executable, "-m", "agentreach.cli", "registry", "--max-connections-per-peer", "-1"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "--max-connections-per-peer: must be a whole number" in refused.stderr


async def test_the_registry_command_holds_one_address_to_its_share(tmp_path):
    registry = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentreach.cli", "registry", "--port", "0", "--auth", "off",
        "--data-dir", str(tmp_path / "data"), "--max-connections-per-peer", "2", cwd=ROOT,
        stderr=asyncio.subprocess.PIPE)
    try:
        url = (await read_log_until(registry, "registry listening"))["url"]
        port = int(url.rsplit(":", 1)[1])
        held = [await slow_connection(port, source=ATTACKER) for _ in range(2)]
        reader, writer = await slow_connection(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", ATTACKER)
        assert (await asyncio.wait_for(closed_by_server(reader), 10)).startswith(b"HTTP/1.1 503")
        writer.close()
        async with calling_from(CALLER) as caller, caller.get(f"{url}/healthz") as answer:
            assert answer.status == 200
        for _, writer in held:
            writer.close()
    finally:
        registry.terminate()
        await registry.communicate()
