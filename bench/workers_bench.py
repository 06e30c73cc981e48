"""Router throughput with `--workers 2` beside `--workers 1`, one command:
`python bench/workers_bench.py [--rounds 5] [--seconds 5] [--workers 2] [--pin]`.

One registry (auth off), one echo agent (bench/router_bench.py's, its own process) and two routers
following the registry, both `--auth off --no-audit` (routing alone, as bench/router_ab.py):
`agentreach router --workers 1` and `agentreach router --workers N`. wrk rounds (one thread, 64
connections) alternate between them, the order reversed every other round, so a burst of load from
the neighbours hits both alike. Per target: best and median calls/s, and the CPU time per call summed
over the router's processes (the parent and every worker): steadier than calls/s on a shared
machine, and what a reader multiplies out for more cores (one core serves about 1e6 / CPU-µs-per-call
calls a second, before wrk, the agent and the kernel take their part). With ``--pin`` the load generator
gets a core of its own: wrk runs on the last CPU this process may use, and the registry, the agent and
both routers (every worker) on the others, so the routers' figures are not the load generator's share of
the same cores. Results: a table on stdout and JSON in bench/results/workers_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from common import (
    ECHO_ID,
    PAYLOAD,
    RESULTS,
    ROOT,
    ROUTER_BENCH,
    alternating_rounds,
    family,
    free_port,
    keep_alive,
    load_average,
    machine,
    require,
    spawn,
    stop_processes,
    wait_http,
    wrk_max,
)

CONNECTIONS = 64


class Target(NamedTuple):
    pid: int  # the `agentreach router` process: with workers, their parent
    url: str


async def wait_routable(url: str, body: bytes, timeout: float = 60) -> None:
    """Until ``url`` answers 20 calls in a row 200, each on a connection of its own, so that every
    worker (the kernel spreads connections) has seen the echo instance on its watch feed."""
    deadline = asyncio.get_running_loop().time() + timeout
    in_a_row = 0
    while in_a_row < 20:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
                session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            in_a_row = in_a_row + 1 if response.status == 200 else 0
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"{url} did not route calls (last status {response.status})")


class Pinning(NamedTuple):
    load: str  # taskset's list for wrk
    serving: set[int]  # the CPUs everything else runs on


def pinning() -> Pinning:
    """The last CPU this process may use for wrk, the rest for the mesh; refused on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs or more: one for wrk, the rest for the mesh")
    return Pinning(load=str(cpus[-1]), serving=set(cpus[:-1]))


def pin(pids: list[int], cpus: set[int]) -> None:
    """Each process and its descendants (the routers' workers and writers) onto ``cpus``."""
    for pid in pids:
        for member in family(pid):
            os.sched_setaffinity(member, cpus)


async def bench(workers: int, rounds: int, seconds: int,
                pinned: Pinning | None = None) -> dict[str, list[dict[str, Any]]]:
    echo, registry = free_port(), free_port()
    echo_url, registry_url = f"http://127.0.0.1:{echo}/echo", f"http://127.0.0.1:{registry}"
    processes = [spawn(ROUTER_BENCH, "echo", "--port", str(echo))]
    beat: asyncio.Task[None] | None = None
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as scratch:
        try:
            processes.append(spawn("-m", "agentreach.cli", "registry", "--port", str(registry), "--data-dir",
                                   f"{scratch}/registry", "--log-level", "warning", "--auth", "off",
                                   "--silence-timeout", "3600"))
            await wait_http(f"http://127.0.0.1:{echo}/healthz")
            await wait_http(f"{registry_url}/healthz")
            registration = {"agent_id": ECHO_ID, "service": "echo", "capabilities": [
                {"name": "echo", "protocol": "rest", "endpoint": echo_url, "timeout_sla_ms": 5000}]}
            async with aiohttp.ClientSession() as session, \
                    session.post(f"{registry_url}/register", json=registration) as response:
                response.raise_for_status()
            beat = asyncio.create_task(keep_alive(registry_url, ECHO_ID))
            targets = {}
            for count in (1, workers):
                port = free_port()
                processes.append(spawn("-m", "agentreach.cli", "router", "--workers", str(count), "--port", str(port),
                                       "--registry", registry_url, "--log-level", "warning", "--auth", "off",
                                       "--no-audit", "--data-dir", f"{scratch}/router-{count}"))
                targets[f"workers={count}"] = Target(processes[-1].pid, f"http://127.0.0.1:{port}/atp")
            body = json.dumps({"capability": "echo", "payload": PAYLOAD}).encode()
            for target in targets.values():
                await wait_http(target.url.replace("/atp", "/healthz"))
                await wait_routable(target.url, body)
            if pinned is not None:
                pin([process.pid for process in processes], pinned.serving)
            load_cpus = pinned.load if pinned is not None else None
            return await alternating_rounds({name: functools.partial(wrk_max, target.url, body, pid=target.pid,
                                                                     cpus=load_cpus)
                                             for name, target in targets.items()}, rounds, seconds)
        finally:
            if beat is not None:
                beat.cancel()
            stop_processes(processes)


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per target: best and median calls/s and CPU per call; each beside `--workers 1`."""
    summary = {}
    for name, results in rounds.items():
        rps = [r["rps"] for r in results]
        cpu = [r["cpu_us_per_call"] for r in results]
        summary[name] = {"best_rps": max(rps), "median_rps": statistics.median(rps), "best_cpu_us": min(cpu),
                         "median_cpu_us": statistics.median(cpu),
                         "median_p99_ms": statistics.median(r["p99_ms"] for r in results),
                         "non_2xx": sum(r["non_2xx"] for r in results)}
    one = summary["workers=1"]
    for row in summary.values():
        row["best_vs_one"] = row["best_rps"] / one["best_rps"]
        row["median_vs_one"] = row["median_rps"] / one["median_rps"]
        row["calls_per_core"] = 1e6 / row["median_cpu_us"]
    return summary


def print_table(info: dict[str, Any], summary: dict[str, dict[str, float]]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}, "
          f"load {info['load_before']} before, {info['load_after']} after")
    print()
    print("| router | best calls/s | median calls/s | / workers=1 (best) | / workers=1 (median) | "
          "CPU µs/call (median) | calls/s per core by CPU | p99 (median) | non-2xx |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in summary.items():
        print(f"| {name} | {row['best_rps']:.0f} | {row['median_rps']:.0f} | {row['best_vs_one']:.2f}x | "
              f"{row['median_vs_one']:.2f}x | {row['median_cpu_us']:.0f} | {row['calls_per_core']:.0f} | "
              f"{row['median_p99_ms']:.1f} ms | {row['non_2xx']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="the worker count set beside 1 (default: 2)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating wrk rounds per router")
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per router and round")
    parser.add_argument("--pin", action="store_true", help="wrk on a CPU of its own, the mesh on the others")
    parser.add_argument("--json", type=Path, default=RESULTS / "workers_bench.json")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers: 2 or more (it is measured beside --workers 1)")
    require("wrk")
    pinned = pinning() if args.pin else None
    if pinned is not None:
        require("taskset")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind like Ctrl-C: the processes stop
    info = machine(load_before=load_average())
    rounds = asyncio.run(bench(args.workers, args.rounds, args.seconds, pinned))
    info["load_after"] = load_average()
    summary = summarize(rounds)
    print_table(info, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "settings": {
        "rounds": args.rounds, "seconds": args.seconds, "wrk_connections": CONNECTIONS, "workers": args.workers,
        "pinned": pinned._asdict() | {"serving": sorted(pinned.serving)} if pinned is not None else None},
        "summary": summary, "rounds": rounds}, indent=2) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
