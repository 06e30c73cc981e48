"""Router benchmark, one command: `python bench/router_bench.py [--seconds 10] [--rates 100,300]`.

In one run, against the same echo agent (a plain aiohttp rest server in its own process), at the
same offered rates, three ways to reach it:

  direct   the load generator calls the echo agent itself
  proxy    through a bare aiohttp pass-through proxy in its own process (no logic: the floor
           for a Python proxy)
  router   through `agentreach router --no-audit` (its own process, following `agentreach
           registry` over its watch feed): POST /atp with a frame; routing alone
  audited  the same with the audit trail on (SQLite, one row per call), as `agentreach router`
           runs by default

Authentication is off in both routers: bench/auth_bench.py measures it on against off.

Latency comes from an open-loop load generator in its own process: it sends at a fixed rate on a
timer whatever the answers do, and times each call from the moment it was due, so a slow target
cannot hide its queueing (no coordinated omission). Added latency is the target's percentile
minus the direct percentile at the same rate. Maximum calls/s comes from wrk (closed loop, 64
connections, alternating rounds, the best counts), with the CPU time the serving process spent
per call beside it: on a shared machine that is the steadier number. Results: a table on stdout and JSON
in bench/results/router_bench.json.

Subcommands used by the run, also handy alone:
  echo  --port 9000                      the echo agent: POST /echo (rest), POST /atp (atp frames)
  proxy --port P --upstream URL          the bare pass-through proxy
  load  --url U --body JSON --rate R ... one open-loop run; prints its summary as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from common import (
    PAYLOAD,
    RESULTS,
    ROOT,
    best_rounds,
    echo_app,
    free_port,
    keep_alive,
    machine,
    require,
    spawn,
    stop_processes,
    wait_http,
    wrk_max,
)

TARGETS = ("direct", "proxy", "router", "audited")


# --- the bare pass-through proxy ---------------------------------------------------------------

def proxy_app(upstream: str) -> web.Application:
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def open_session(app: web.Application) -> None:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30)))

    async def close_session(app: web.Application) -> None:
        await sessions[0].close()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        async with sessions[0].post(upstream, data=body, headers={"Content-Type": "application/json"}) as answer:
            return web.Response(body=await answer.read(), status=answer.status, content_type="application/json")

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/{tail:.*}", forward)
    return app


# --- the open-loop load generator --------------------------------------------------------------

def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def open_loop(url: str, body: bytes, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
    """Send ``rate`` calls/s for ``warmup + seconds``; time the last ``seconds`` from when each was due."""
    latencies: list[float] = []
    errors = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(due: float, measured: bool) -> None:
            nonlocal errors
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            if measured:
                latencies.append(time.perf_counter() - due)
                errors += not ok

        total = int((warmup + seconds) * rate)
        first_measured = int(warmup * rate)
        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(total):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due, i >= first_measured)))
        await asyncio.gather(*tasks)
    ordered = sorted(latency * 1000 for latency in latencies)
    return {"calls": len(ordered), "errors": errors, "p50_ms": percentile(ordered, 0.50),
            "p90_ms": percentile(ordered, 0.90), "p99_ms": percentile(ordered, 0.99), "max_ms": ordered[-1],
            "mean_ms": statistics.fmean(ordered)}


# --- orchestration -----------------------------------------------------------------------------

def run_load(url: str, body: bytes, rate: int, seconds: float, warmup: float) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "load", "--url", url, "--body", body.decode(), "--rate",
                          str(rate), "--seconds", str(seconds), "--warmup", str(warmup)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ports = {name: free_port() for name in ("echo", "proxy", "registry", "router", "audited")}
    echo = f"http://127.0.0.1:{ports['echo']}"
    registry = f"http://127.0.0.1:{ports['registry']}"
    urls = {"direct": f"{echo}/echo", "proxy": f"http://127.0.0.1:{ports['proxy']}/echo",
            "router": f"http://127.0.0.1:{ports['router']}/atp", "audited": f"http://127.0.0.1:{ports['audited']}/atp"}
    payload = json.dumps(PAYLOAD).encode()
    frame = json.dumps({"capability": "echo", "payload": PAYLOAD}).encode()
    bodies = {"direct": payload, "proxy": payload, "router": frame, "audited": frame}
    with tempfile.TemporaryDirectory() as data_dir:
        processes = [
            spawn(__file__, "echo", "--port", str(ports["echo"])),
            spawn(__file__, "proxy", "--port", str(ports["proxy"]), "--upstream", urls["direct"]),
            # Routers in processes of their own (as `agentreach router` runs), so the CPU time per call
            # is a router's alone: `agentreach up` would add the registry's and the console's.
            spawn("-m", "agentreach.cli", "router", "--port", str(ports["router"]), "--registry", registry,
                  "--log-level", "warning", "--auth", "off", "--data-dir", data_dir, "--no-audit"),
            spawn("-m", "agentreach.cli", "router", "--port", str(ports["audited"]), "--registry", registry,
                  "--log-level", "warning", "--auth", "off", "--data-dir", data_dir),
            spawn("-m", "agentreach.cli", "registry", "--port", str(ports["registry"]), "--data-dir", data_dir,
                  "--log-level", "warning", "--auth", "off"),
        ]
        beating: asyncio.Task[None] | None = None
        try:
            await wait_http(f"{echo}/healthz")
            await wait_http(f"{registry}/healthz")
            for router in ("router", "audited"):
                await wait_http(f"http://127.0.0.1:{ports[router]}/healthz")
            async with aiohttp.ClientSession() as session:
                registration = {"agent_id": "echo-1", "service": "echo", "capabilities": [
                    {"name": "echo", "protocol": "rest", "endpoint": urls["direct"], "timeout_sla_ms": 5000}]}
                async with session.post(f"{registry}/register", json=registration) as response:
                    response.raise_for_status()
            beating = asyncio.create_task(keep_alive(registry, "echo-1"))
            await asyncio.sleep(1.0)  # the router sees the instance healthy within a hub tick (0.5 s)
            loop = asyncio.get_running_loop()
            latency: dict[str, dict[str, Any]] = {}
            for rate in args.rates:
                for target in TARGETS:
                    result = await loop.run_in_executor(None, run_load, urls[target], bodies[target], rate,
                                                        args.seconds, args.warmup)
                    latency[f"{target}@{rate}"] = result
                    print(f"  {target:>6} @ {rate:>4}/s  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms"
                          f"  errors {result['errors']}", file=sys.stderr)
            # Rounds alternate the targets so a neighbour's burst hits them alike; the best round counts.
            pids = dict(zip(TARGETS, (process.pid for process in processes), strict=False))
            rounds: dict[str, list[dict[str, Any]]] = {target: [] for target in TARGETS}
            for _ in range(args.wrk_rounds):
                for target in TARGETS:
                    result = await loop.run_in_executor(None, wrk_max, urls[target], bodies[target],
                                                        args.wrk_seconds, pids[target])
                    rounds[target].append(result)
                    print(f"  {target:>6} max {result['rps']:.0f} calls/s, "
                          f"{result['cpu_us_per_call']:.0f} us CPU/call", file=sys.stderr)
            throughput = best_rounds(rounds)
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
    return {"latency": latency, "throughput": throughput}


def summarize(raw: dict[str, Any], rates: list[int]) -> dict[str, Any]:
    rows = []
    for rate in rates:
        direct = raw["latency"][f"direct@{rate}"]
        for target in TARGETS:
            result = raw["latency"][f"{target}@{rate}"]
            rows.append({"target": target, "rate": rate, "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
                         "added_p50_ms": result["p50_ms"] - direct["p50_ms"],
                         "added_p99_ms": result["p99_ms"] - direct["p99_ms"], "errors": result["errors"],
                         "calls": result["calls"]})
    throughput = {target: raw["throughput"][target]["rps"] for target in TARGETS}
    cpu = {target: raw["throughput"][target]["cpu_us_per_call"] for target in TARGETS}
    router_at_300 = next((row for row in rows if row["target"] == "router" and row["rate"] == 300), None)
    targets = {
        "added_p50_le_1ms_at_300": None if router_at_300 is None else router_at_300["added_p50_ms"] <= 1.0,
        "added_p99_le_3ms_at_300": None if router_at_300 is None else router_at_300["added_p99_ms"] <= 3.0,
        "router_max_ge_0.7x_proxy": throughput["router"] >= 0.7 * throughput["proxy"],
    }
    return {"rows": rows, "max_calls_per_s": throughput, "cpu_us_per_call": cpu,
            "router_vs_proxy_throughput": throughput["router"] / throughput["proxy"],
            "audited_vs_proxy_throughput": throughput["audited"] / throughput["proxy"],
            "proxy_vs_router_cpu_per_call": cpu["proxy"] / cpu["router"], "targets": targets}


def print_table(info: dict[str, str], summary: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}")
    print()
    print("| target | offered calls/s | p50 ms | p99 ms | added p50 ms | added p99 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in summary["rows"]:
        added = ("-", "-") if row["target"] == "direct" else \
            (f"{row['added_p50_ms']:+.2f}", f"{row['added_p99_ms']:+.2f}")
        print(f"| {row['target']} | {row['rate']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {added[0]} | "
              f"{added[1]} | {row['errors']} |")
    print()
    print("| target | max calls/s (wrk -c 64, best round) | CPU per call in the serving process |")
    print("|---|---:|---:|")
    for target, rps in summary["max_calls_per_s"].items():
        print(f"| {target} | {rps:.0f} | {summary['cpu_us_per_call'][target]:.0f} us |")
    print()
    print(f"router / proxy throughput: {summary['router_vs_proxy_throughput']:.2f}x "
          f"(by CPU per call: {summary['proxy_vs_router_cpu_per_call']:.2f}x); audited router / proxy: "
          f"{summary['audited_vs_proxy_throughput']:.2f}x (the audit trail's cost; the target is the router's)")
    for name, met in summary["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED' if met is not None else 'not measured'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="the whole benchmark (the default)")
    for command in (parser, run):
        command.add_argument("--seconds", type=float, default=10, help="measured seconds per latency run")
        command.add_argument("--warmup", type=float, default=2, help="unmeasured seconds before each run")
        command.add_argument("--rates", type=lambda text: [int(r) for r in text.split(",")], default=[100, 300],
                             help="offered calls/s, comma separated (default 100,300)")
        command.add_argument("--wrk-seconds", type=int, default=5, help="wrk duration per target and round")
        command.add_argument("--wrk-rounds", type=int, default=3, help="alternating wrk rounds (best counts)")
        command.add_argument("--json", type=Path, default=RESULTS / "router_bench.json")
    echo = commands.add_parser("echo", help="run the echo agent")
    echo.add_argument("--port", type=int, default=9000)
    proxy = commands.add_parser("proxy", help="run the bare pass-through proxy")
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--upstream", required=True)
    load = commands.add_parser("load", help="one open-loop run")
    load.add_argument("--url", required=True)
    load.add_argument("--body", required=True)
    load.add_argument("--rate", type=int, required=True)
    load.add_argument("--seconds", type=float, default=10)
    load.add_argument("--warmup", type=float, default=2)
    args = parser.parse_args()
    if args.command == "echo":
        web.run_app(echo_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)
    elif args.command == "proxy":
        web.run_app(proxy_app(args.upstream), host="127.0.0.1", port=args.port, access_log=None, print=None)
    elif args.command == "load":
        print(json.dumps(asyncio.run(open_loop(args.url, args.body.encode(), args.rate, args.seconds, args.warmup))))
    else:
        require("wrk")
        info = machine()
        raw = asyncio.run(bench(args))
        summary = summarize(raw, args.rates)
        print_table(info, summary)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "settings": {
            "seconds": args.seconds, "warmup": args.warmup, "rates": args.rates, "wrk_seconds": args.wrk_seconds,
            "wrk_rounds": args.wrk_rounds, "wrk_connections": 64}, "summary": summary, "raw": raw}, indent=2) + "\n")
        print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
