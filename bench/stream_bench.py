"""Streaming benchmark, one command: `python bench/stream_bench.py [--samples 200] [--chunks 20000] [--streams 1000]`.

One streaming agent (a plain aiohttp rest agent answering text/event-stream, in its own process),
`agentreach registry` and `agentreach router --no-audit --auth off` (each in its own process), and
the caller in this process reading server-sent events as they arrive. Side by side, in alternating
rounds so a noisy neighbour hits both alike:

  time to first chunk   a call whose agent writes one chunk at once: from sending the request to
                        reading that chunk, direct to the agent vs through the router (p50, p99)
  chunk throughput      one stream of --chunks small chunks written as fast as the agent can:
                        chunks/s and MB/s at the caller, direct vs router (best of --rounds)
  memory per stream     --streams streams held open at once through the router (each has sent its
                        first chunk and waits): the router process's RSS growth divided by their number

Results: a table on stdout and JSON in bench/results/stream_bench.json.

Subcommand used by the run, also handy alone:
  agent --port P   the streaming agent: POST /stream {"n", "size", "every_ms", "hold_s"}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from agent_reach.sse import EventParser
from aiohttp import web

from common import RESULTS, free_port, keep_alive, machine, spawn, stop_processes, stream_events, wait_http

SSE = {"Accept": "text/event-stream"}


# --- the streaming agent -------------------------------------------------------------------------

def agent_app() -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        """``n`` chunks of a ``size``-character string, ``every_ms`` apart; then, with ``hold_s``, silence for
        that long before the stream ends (an open stream costing nothing but its connection)."""
        asked = json.loads(await request.read())
        return await stream_events(request, ["x" * asked.get("size", 16)] * asked.get("n", 1),
                                   asked.get("every_ms", 0) / 1000, asked.get("hold_s", 0))

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_get("/healthz", healthz)
    return app


# --- the caller ----------------------------------------------------------------------------------

class Target:
    """One way to reach the agent's stream: the body to send for an ``ask`` and where."""

    def __init__(self, name: str, url: str, framed: bool):
        self.name, self.url, self.framed = name, url, framed

    def body(self, ask: dict[str, Any]) -> bytes:
        return json.dumps({"capability": "bench.stream", "payload": ask} if self.framed else ask).encode()


async def read_chunks(session: aiohttp.ClientSession, target: Target, ask: dict[str, Any],
                      first: asyncio.Event | None = None,
                      hold: asyncio.Event | None = None) -> tuple[float, float, int]:
    """(seconds to the first chunk, seconds from the first chunk to the last, chunks) of one stream; with
    ``hold``, stop after the first chunk and keep the stream open until it is set."""
    started = time.perf_counter()
    first_at = last_at = 0.0
    chunks = 0
    parser = EventParser()
    async with session.post(target.url, data=target.body(ask), headers=SSE) as response:
        async for received in response.content.iter_any():
            for event in parser.feed(received):
                if event.name == "error":
                    raise RuntimeError(f"{target.name} stream failed: {event.data.decode()}")
                if event.name not in ("chunk", "message"):
                    continue
                last_at = time.perf_counter()
                chunks += 1
                if chunks == 1:
                    first_at = last_at
                    if first is not None:
                        first.set()
                    if hold is not None:
                        await hold.wait()
                        return first_at - started, 0.0, chunks
    return first_at - started, last_at - first_at, chunks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def first_chunk(session: aiohttp.ClientSession, targets: list[Target], samples: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {target.name: [] for target in targets}
    for _ in range(samples):
        for target in targets:
            seconds, _, _ = await read_chunks(session, target, {"n": 1})
            times[target.name].append(seconds * 1000)
    return {name: {"p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99), "mean_ms": statistics.fmean(ms)}
            for name, ms in times.items()}


async def throughput(session: aiohttp.ClientSession, targets: list[Target], chunks: int, size: int,
                     rounds: int) -> dict[str, Any]:
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for target in targets:
            _, seconds, read = await read_chunks(session, target, {"n": chunks, "size": size})
            assert read == chunks, f"{target.name} streamed {read} of {chunks} chunks"
            rate = (read - 1) / seconds
            if rate > best.get(target.name, {}).get("chunks_per_s", 0):
                best[target.name] = {"chunks_per_s": rate, "mb_per_s": rate * (size + 2) / 1e6}
    return best


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


async def memory_per_stream(router: Target, router_pid: int, streams: int) -> dict[str, Any]:
    """Hold ``streams`` router streams open at once (each has its first chunk) and weigh the router."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        await read_chunks(session, router, {"n": 1})  # one stream first: its one-time costs are not counted
        before = rss_bytes(router_pid)
        hold = asyncio.Event()
        firsts = [asyncio.Event() for _ in range(streams)]
        readers: list[asyncio.Task[tuple[float, float, int]]] = []
        started = time.perf_counter()
        # In waves of 100: a thousand connections at once overflow the agent's accept queue, and a SYN
        # retried after 1 s is a router connect timeout, not a stream's cost.
        for wave in range(0, streams, 100):
            readers += [asyncio.create_task(read_chunks(session, router, {"n": 1, "hold_s": 600}, first, hold))
                        for first in firsts[wave:wave + 100]]
            opened = asyncio.gather(*(first.wait() for first in firsts[wave:wave + 100]))
            done, _ = await asyncio.wait([opened, *readers], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if opened not in done:
                failed = next((reader for reader in done if reader is not opened), None)
                raise RuntimeError(f"streams did not all open: {failed.result() if failed else 'timed out'}")
        opened_s = time.perf_counter() - started
        during = rss_bytes(router_pid)
        hold.set()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return {"streams": streams, "rss_before_mib": before / 2**20, "rss_open_mib": during / 2**20,
            "kib_per_stream": (during - before) / streams / 1024, "seconds_to_open_all": opened_s}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ports = {name: free_port() for name in ("agent", "registry", "router")}
    agent = f"http://127.0.0.1:{ports['agent']}"
    registry = f"http://127.0.0.1:{ports['registry']}"
    direct = Target("direct", f"{agent}/stream", framed=False)
    router = Target("router", f"http://127.0.0.1:{ports['router']}/atp", framed=True)
    with tempfile.TemporaryDirectory() as data_dir:
        processes = [
            spawn(__file__, "agent", "--port", str(ports["agent"])),
            spawn("-m", "agentreach.cli", "registry", "--port", str(ports["registry"]), "--data-dir", data_dir,
                  "--log-level", "warning", "--auth", "off"),
            spawn("-m", "agentreach.cli", "router", "--port", str(ports["router"]), "--registry", registry,
                  "--log-level", "warning", "--auth", "off", "--data-dir", data_dir, "--no-audit"),
        ]
        beating: asyncio.Task[None] | None = None
        try:
            for url in (agent, registry, f"http://127.0.0.1:{ports['router']}"):
                await wait_http(f"{url}/healthz")
            async with aiohttp.ClientSession() as session:
                registration = {"agent_id": "streamer-1", "service": "bench", "capabilities": [
                    {"name": "bench.stream", "protocol": "rest", "endpoint": direct.url, "timeout_sla_ms": 900_000}]}
                async with session.post(f"{registry}/register", json=registration) as response:
                    response.raise_for_status()
                beating = asyncio.create_task(keep_alive(registry, "streamer-1"))
                await until_routed(session, router)
                targets = [direct, router]
                ttfc = await first_chunk(session, targets, args.samples)
                print(f"  first chunk: {ttfc}", file=sys.stderr)
                rates = await throughput(session, targets, args.chunks, args.size, args.rounds)
                print(f"  throughput: {rates}", file=sys.stderr)
            memory = await memory_per_stream(router, processes[2].pid, args.streams)
            print(f"  memory: {memory}", file=sys.stderr)
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
    return {"first_chunk": ttfc, "throughput": rates, "memory": memory,
            "settings": {"samples": args.samples, "chunks": args.chunks, "size": args.size, "rounds": args.rounds}}


async def until_routed(session: aiohttp.ClientSession, router: Target) -> None:
    """Until the router has the agent in its copy of the registry (its feed follows within a tick)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with session.post(router.url, data=router.body({"n": 1})) as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the router never routed to the streaming agent")


def print_table(info: dict[str, str], raw: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}")
    print()
    print("| target | first chunk p50 | p99 | chunks/s (one stream) | MB/s |")
    print("|---|---:|---:|---:|---:|")
    for name in ("direct", "router"):
        ttfc, rate = raw["first_chunk"][name], raw["throughput"][name]
        print(f"| {name} | {ttfc['p50_ms']:.2f} ms | {ttfc['p99_ms']:.2f} ms | {rate['chunks_per_s']:,.0f} | "
              f"{rate['mb_per_s']:.2f} |")
    memory = raw["memory"]
    print()
    print(f"{memory['streams']} streams open through the router: RSS {memory['rss_before_mib']:.1f} -> "
          f"{memory['rss_open_mib']:.1f} MiB, {memory['kib_per_stream']:.1f} KiB per open stream "
          f"(all open in {memory['seconds_to_open_all']:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="the whole benchmark (the default)")
    for command in (parser, run):
        command.add_argument("--samples", type=int, default=200, help="first-chunk calls per target")
        command.add_argument("--chunks", type=int, default=20_000, help="chunks in the throughput stream")
        command.add_argument("--size", type=int, default=64, help="characters per throughput chunk")
        command.add_argument("--rounds", type=int, default=3, help="alternating throughput rounds (best counts)")
        command.add_argument("--streams", type=int, default=1000, help="streams held open for the memory figure")
    serve = commands.add_parser("agent", help="the streaming agent")
    serve.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    if args.command == "agent":
        web.run_app(agent_app(), host="127.0.0.1", port=args.port, print=None, access_log=None, shutdown_timeout=1,
                    backlog=4096)
        return
    info = machine()
    raw = asyncio.run(bench(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stream_bench.json").write_text(json.dumps({"machine": info, **raw}, indent=2))
    print_table(info, raw)


if __name__ == "__main__":
    main()
