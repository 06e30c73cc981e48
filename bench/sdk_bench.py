"""SDK benchmarks, one command: `python bench/sdk_bench.py [--json out.json]`.

1. Per-call overhead at the agent: time from the request reaching the agent's aiohttp app to the
   response leaving the SDK, minus the handler's own time (a timing middleware sits outermost in
   the app; the handler times itself). Load from wrk in its own process, 1 and 16 connections,
   small and 64 KiB payloads.
2. CPU cost of heartbeats per agent per hour: many SDK agents in one process heartbeat a registry
   (its own process) at a short interval; process CPU per beat (minus an idle run with the same
   agents and watchdogs but no beats), scaled to the default 3 s interval. The watchdog's own
   cost (10 wake-ups a second) is reported next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import statistics
import tempfile
import time
from pathlib import Path

from agent_reach import AgentReachSDK
from agent_reach.serving import listen
from aiohttp import web

from common import RESULTS, RegistryProcess, free_port, machine, post_script, rank_at, require, wrk

HOUR = 3600.0
DEFAULT_INTERVAL = 3.0


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_us": round(rank_at(ordered, 0.50), 1), "p90_us": round(rank_at(ordered, 0.90), 1),
            "p99_us": round(rank_at(ordered, 0.99), 1), "mean_us": round(statistics.fmean(ordered), 1)}


# Per request: the middleware's start time in, the handler's own duration out (shared through the
# contextvar, which the SDK's handler task inherits).
_timing: contextvars.ContextVar[list[float]] = contextvars.ContextVar("bench_timing")


async def bench_overhead(registry_url: str, seconds: int) -> list[dict]:
    overhead_us: list[float] = []
    handler_us: list[float] = []

    @web.middleware
    async def timing(request: web.Request, handler):
        cell = [0.0]
        _timing.set(cell)
        started = time.perf_counter()
        response = await handler(request)
        total = (time.perf_counter() - started) * 1e6
        overhead_us.append(total - cell[0])
        handler_us.append(cell[0])
        return response

    port = free_port()
    app = web.Application(middlewares=[timing], client_max_size=4 * 1024 * 1024)
    sdk = AgentReachSDK(agent_id="bench-overhead", registry_url=registry_url, zone="bench",
                        base_url=f"http://127.0.0.1:{port}", max_inflight=1024)

    @sdk.capability("bench.echo", max_payload_bytes=2 * 1024 * 1024)
    async def echo(payload, ctx):
        started = time.perf_counter()
        await asyncio.sleep(0)
        _timing.get()[0] = (time.perf_counter() - started) * 1e6
        return payload

    sdk.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    rows = []
    try:
        for label, size in (("small", 100), ("64KiB", 65536)):
            frame = json.dumps({"capability": "bench.echo", "payload": {"text": "x" * size}})
            for connections in (1, 16):
                overhead_us.clear()
                handler_us.clear()
                load = await asyncio.to_thread(wrk, f"{sdk.base_url}/atp/bench.echo", post_script(frame),
                                               connections, seconds)
                rows.append({"payload": label, "connections": connections, "calls_per_s": load.rps,
                             "client_p50_ms": load.latency_ms(50), "overhead": percentiles(overhead_us),
                             "handler": percentiles(handler_us)})
    finally:
        await runner.cleanup()
        await sdk.stop()
    return rows


async def run_agents(registry_url: str, count: int, interval: float, seconds: float) -> tuple[float, int]:
    """Process CPU seconds and heartbeats sent while ``count`` agents run for ``seconds``."""
    agents = []
    for n in range(count):
        sdk = AgentReachSDK(agent_id=f"bench-hb-{n}", registry_url=registry_url, zone="bench",
                            service="bench-hb", heartbeat_interval=interval)

        @sdk.capability("bench.hb")
        async def noop(payload, ctx):
            return None

        await sdk.start()
        agents.append(sdk)
    beats_before = sum(sdk.link.beats for sdk in agents)
    cpu_before = time.process_time()
    await asyncio.sleep(seconds)
    cpu = time.process_time() - cpu_before
    beats = sum(sdk.link.beats for sdk in agents) - beats_before
    for sdk in agents:
        await sdk.stop()
    return cpu, beats


async def bench_heartbeat_cpu(registry_url: str, agents: int, seconds: float) -> dict:
    busy_cpu, beats = await run_agents(registry_url, agents, 0.02, seconds)
    idle_cpu, _ = await run_agents(registry_url, agents, HOUR, seconds)
    per_beat = (busy_cpu - idle_cpu) / beats
    watchdog_per_hour = idle_cpu / agents / seconds * HOUR
    return {"agents": agents, "seconds": seconds, "beats": beats, "cpu_us_per_beat": round(per_beat * 1e6, 1),
            "heartbeat_cpu_s_per_agent_hour": round(per_beat * HOUR / DEFAULT_INTERVAL, 3),
            "watchdog_cpu_s_per_agent_hour": round(watchdog_per_hour, 3)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load-seconds", type=int, default=5, help="wrk duration per overhead run")
    parser.add_argument("--agents", type=int, default=20, help="agents in the heartbeat CPU run")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each heartbeat CPU run")
    parser.add_argument("--json", type=Path, default=RESULTS / "sdk_bench.json")
    args = parser.parse_args()
    require("wrk")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdk-bench-") as work:
        registry = RegistryProcess(Path(work) / "registry")
        await registry.wait_ready()
        try:
            results = {"machine": machine(), "overhead": await bench_overhead(registry.url, args.load_seconds),
                       "heartbeats": await bench_heartbeat_cpu(registry.url, args.agents, args.seconds)}
        finally:
            registry.stop()
    print(f"{'payload':>8} {'conns':>5} {'calls/s':>8} {'overhead p50 / p99 (us)':>24} {'handler p50 (us)':>17}")
    for row in results["overhead"]:
        overhead = row["overhead"]
        print(f"{row['payload']:>8} {row['connections']:>5} {row['calls_per_s']:>8.0f} "
              f"{overhead['p50_us']:>12} / {overhead['p99_us']:<9} {row['handler']['p50_us']:>17}")
    beats = results["heartbeats"]
    print(f"heartbeat: {beats['cpu_us_per_beat']} us CPU per beat -> {beats['heartbeat_cpu_s_per_agent_hour']} "
          f"CPU s per agent-hour at {DEFAULT_INTERVAL:g} s; watchdog {beats['watchdog_cpu_s_per_agent_hour']} "
          "CPU s per agent-hour")
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
