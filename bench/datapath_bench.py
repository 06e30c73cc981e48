"""The router's data path as it runs by default, one command:
`python bench/datapath_bench.py [--wrk-rounds 3] [--p99-rounds 5] [--wrk-seconds 5]`.

In one run, against the same echo agent (bench/common.py's, its own process), four ways to reach it:

  nginx     nginx as a keepalive reverse proxy (the C reference; one worker, no master)
  proxy     the bare aiohttp pass-through proxy of bench/router_bench.py (the floor for aiohttp)
  floor     bench/floor_router.py: only what the default router's contract demands of each call (the API
            key looked up, the frame decoded, a signed forward under a deadline, the answer framed, the
            audit row recorded in the product's AuditLog), none of the router's own code around it
  default   `agentreach router` as it runs by default: auth on (each call carries `X-API-Key`), the
            audit trail on, forwards signed (the agent joined with a registration token)
  no_audit  the same router with `--no-audit`: what the audit trail costs

Bodies of 1 KB and 32 B (the proxies get the payload, the routers a frame carrying the same payload).
Maximum calls/s from wrk -c 64, rounds alternating the ways (order reversed every other round), the
best round counting, with the CPU time the serving process and its descendants spent per call (and of
it the descendants': the default router's audit writer); then p99 at one
connection (wrk -c 1, `--p99-rounds` alternating rounds, the median counting), where the audit trail's
stalls would show. The audit trail's cost to p99 is the median of each round's difference between the
default router and the one without audit (measured next to each other in every round, so a burst of
load on this shared machine hits both alike). With
`--uvloop`, four more ways: the bare proxy, the floor and the default router on uvloop's event loop, and the
floor served by uvicorn's httptools protocol on uvloop (`floor+uvicorn`). Ratios to the bare proxy come from
the same run. Results: tables on stdout, JSON in bench/results/datapath_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

import owners
from auth_bench import enrol
from common import (
    RESULTS,
    ROOT,
    ROUTER_BENCH,
    best_rounds,
    free_port,
    keep_alive,
    load_average,
    machine,
    post_script,
    require,
    spawn,
    stop_processes,
    wait_http,
    wrk,
    wrk_max,
)
from registry.access import read_admin_key

AUTH_BENCH = str(Path(__file__).with_name("auth_bench.py"))
FLOOR_ROUTER = str(Path(__file__).with_name("floor_router.py"))
WAYS = ("nginx", "proxy", "floor", "default", "no_audit")
# With --uvloop: the bare proxy, the floor and the default router on uvloop's event loop (the same code
# otherwise), and the floor served by uvicorn's httptools protocol on uvloop.
UVLOOP_WAYS = ("proxy+uvloop", "floor+uvloop", "floor+uvicorn", "default+uvloop")
# `python -c UNDER_UVLOOP <script or -m module> args...`: that command line, run on uvloop.
UNDER_UVLOOP = """
import asyncio, os, runpy, sys, uvloop
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
SIZES = {"1k": 1024, "32b": 32}
# With --profile: the ways whose CPU a call is sampled by owner (bench/owners.py), at 1 KB under wrk -c 64.
PROFILED = ("proxy", "floor", "default")


def is_router(way: str) -> bool:
    return way.startswith(("floor", "default", "no_audit"))


def payload(size: int) -> bytes:
    """A JSON payload of exactly ``size`` bytes."""
    shell = b'{"text":""}'
    return b'{"text":"' + b"a" * (size - len(shell)) + b'"}'


def frame(body: bytes) -> bytes:
    return b'{"capability":"echo","payload":' + body + b"}"


def start_nginx(directory: Path, port: int, upstream_port: int) -> subprocess.Popen:
    """One nginx worker (no master, so its CPU is one process's) proxying with keepalive upstream connections."""
    config = directory / "nginx.conf"
    config.write_text(f"""daemon off; master_process off; worker_processes 1;
pid {directory}/nginx.pid; error_log {directory}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {directory}/body; proxy_temp_path {directory}/proxy;
  fastcgi_temp_path {directory}/fastcgi; uwsgi_temp_path {directory}/uwsgi; scgi_temp_path {directory}/scgi;
  upstream echo {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://echo; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
}}
""")
    return subprocess.Popen(["nginx", "-p", str(directory), "-c", str(config)], cwd=ROOT)


async def wait_answered(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> None:
    """Until the way answers the bench call 200 (a router learns the agent and the client from the watch feed)."""
    for _ in range(400):
        with contextlib.suppress(aiohttp.ClientConnectionError):
            async with session.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as answer:
                if answer.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never answered the bench call")


def one_connection_p99(url: str, body: bytes, seconds: int, headers: dict[str, str]) -> dict[str, Any]:
    run = wrk(url, post_script(body, headers), 1, seconds)
    return {"rps": run.rps, "p50_ms": run.latency_ms(50), "p99_ms": run.latency_ms(99)}


async def alternate(measure: Any, ways: tuple[str, ...], rounds: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``measure(way, size)`` for every way and size, ``rounds`` times, the order reversed every other round."""
    loop = asyncio.get_running_loop()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {size: {way: [] for way in ways} for size in SIZES}
    for index in range(rounds):
        for size in SIZES:
            for way in (ways if index % 2 == 0 else tuple(reversed(ways))):
                result = await loop.run_in_executor(None, measure, way, size)
                results[size][way].append(result)
                print(f"  {size:>3} {way:>14} {json.dumps(result)}", file=sys.stderr)
    return results


def profile(url: str, body: bytes, headers: dict[str, str], pid: int, seconds: int) -> dict[str, float]:
    """CPU a call by owner of the code (µs), sampled over ``seconds`` while wrk -c 64 loads ``pid``."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(wrk_max, url, body, seconds + 1, pid, headers=headers)
        samples = owners.record(pid, seconds)
        calls = round(load.result()["rps"] * seconds)
    return owners.per_call_us(samples, calls)


def python_command(args: argparse.Namespace, way: str, port: int, echo: str, registry: str,
                   data_dir: str, api_key: str) -> tuple[str, ...]:
    """A Python way's command line (after the interpreter); a `+uvloop` way runs it on uvloop."""
    plain = way.removesuffix("+uvloop")
    if plain == "proxy":
        line: tuple[str, ...] = (ROUTER_BENCH, "proxy", "--port", str(port), "--upstream", f"{echo}/echo")
    elif plain in ("floor", "floor+uvicorn"):  # uvicorn's floor is on uvloop of itself
        line = (FLOOR_ROUTER, "--port", str(port), "--upstream", f"{echo}/echo", "--api-key", api_key,
                "--audit", str(Path(data_dir) / f"{way}.sqlite"),
                *(("--server", "uvicorn") if plain != "floor" else ()))
    else:
        line = ("-m", "agentreach.cli", "router", "--port", str(port), "--registry", registry, "--data-dir",
                data_dir, "--log-level", "warning", *(("--no-audit",) if plain == "no_audit" else ()),
                *args.router_flag)
    return ("-c", UNDER_UVLOOP, *line) if plain != way else line


async def bench(args: argparse.Namespace, ways: tuple[str, ...]) -> dict[str, Any]:
    ports = {name: free_port() for name in ("echo", "registry", *ways)}
    echo = f"http://127.0.0.1:{ports['echo']}"
    registry = f"http://127.0.0.1:{ports['registry']}"
    urls = {way: f"http://127.0.0.1:{ports[way]}/{'atp' if is_router(way) else 'echo'}" for way in ways}
    bodies = {size: {way: frame(payload(n)) if is_router(way) else payload(n) for way in ways}
              for size, n in SIZES.items()}
    # nginx's files apart: the router warns of any file in its data dir that others may read.
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory() as nginx_dir:
        data_dir = Path(scratch)
        processes = [spawn(ROUTER_BENCH, "echo", "--port", str(ports["echo"])),
                     spawn(AUTH_BENCH, "registry", "--port", str(ports["registry"]), "--data-dir", scratch)]
        beating: asyncio.Task[None] | None = None
        try:
            await wait_http(f"{echo}/healthz")
            await wait_http(f"{registry}/healthz")
            servers = {"nginx": start_nginx(Path(nginx_dir), ports["nginx"], ports["echo"])}
            processes.append(servers["nginx"])
            admin = {"X-API-Key": read_admin_key(data_dir) or ""}
            async with aiohttp.ClientSession() as session:
                client, token = await enrol(session, registry, echo, admin)
                servers |= {way: spawn(*python_command(args, way, ports[way], echo, registry, scratch,
                                                       client["api_key"])) for way in ways if way != "nginx"}
                processes += [servers[way] for way in ways if way != "nginx"]
                beating = asyncio.create_task(keep_alive(registry, "echo-1", token))
                headers = {way: {"X-API-Key": client["api_key"]} if is_router(way) else {} for way in ways}
                for way in ways:
                    await wait_answered(session, urls[way], bodies["1k"][way], headers[way])
                throughput = await alternate(lambda way, size: wrk_max(
                    urls[way], bodies[size][way], args.wrk_seconds, servers[way].pid, headers=headers[way]),
                    ways, args.wrk_rounds)
                single = await alternate(lambda way, size: one_connection_p99(
                    urls[way], bodies[size][way], args.wrk_seconds, headers[way]), ways, args.p99_rounds)
                profiles = {way: await asyncio.to_thread(profile, urls[way], bodies["1k"][way], headers[way],
                                                         servers[way].pid, args.profile)
                            for way in PROFILED if args.profile}
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
    return {"throughput": {size: best_rounds(rounds) for size, rounds in throughput.items()},
            "one_connection": single, "profiles": profiles}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for size in SIZES:
        best = raw["throughput"][size]
        ways = tuple(best)
        proxy = best["proxy"]["rps"]
        rounds = raw["one_connection"][size]
        single = {way: statistics.median(r["p99_ms"] for r in rounds[way]) for way in ways}
        audit_p99 = [with_audit["p99_ms"] - without["p99_ms"]
                     for with_audit, without in zip(rounds["default"], rounds["no_audit"], strict=True)]
        summary[size] = {
            "max_calls_per_s": {way: best[way]["rps"] for way in ways},
            "cpu_us_per_call": {way: best[way]["cpu_us_per_call"] for way in ways},
            # The serving process's descendants: the default router's audit writer (nginx's and the proxy's: none).
            "descendants_cpu_us_per_call": {way: min(r["descendants_cpu_us_per_call"] for r in best[way]["rounds"])
                                            for way in ways},
            "vs_proxy": {way: best[way]["rps"] / proxy for way in ways},
            # Steadier than the best rounds': each round's calls/s against the proxy's in the same round.
            "vs_proxy_paired": {way: statistics.median(
                mine["rps"] / theirs["rps"]
                for mine, theirs in zip(best[way]["rounds"], best["proxy"]["rounds"], strict=True)) for way in ways},
            "p99_ms_one_connection": single,
            "audit_cost_throughput": 1 - best["default"]["rps"] / best["no_audit"]["rps"],
            # Steadier than the best rounds' calls/s: each round's CPU a call, default against no_audit beside it.
            "audit_cost_cpu": statistics.median(
                with_audit["cpu_us_per_call"] / without["cpu_us_per_call"] - 1
                for with_audit, without in zip(best["default"]["rounds"], best["no_audit"]["rounds"], strict=True)),
            "audit_cost_p99_ms": statistics.median(audit_p99),
            "audit_cost_p99_ms_rounds": audit_p99,
        }
    summary["profiles"] = raw["profiles"]
    one_k = summary["1k"]
    summary["targets"] = {"default_ge_0.85x_proxy_1k": one_k["vs_proxy"]["default"] >= 0.85,
                          "default_p99_within_0.3ms_of_no_audit_1k": one_k["audit_cost_p99_ms"] <= 0.3}
    return summary


def print_profiles(profiles: dict[str, dict[str, float]]) -> None:
    ways = tuple(profiles)
    print("\nsampled CPU a call by owner of the code, 1 KB (py-spy, bench/owners.py)\n")
    print(f"| owner | {' | '.join(ways)} |")
    print(f"|---|{'---:|' * len(ways)}")
    for owner in dict.fromkeys(owner for profile in profiles.values() for owner in profile):
        print(f"| {owner} | {' | '.join(f'{profiles[way].get(owner, 0.0):.0f} us' for way in ways)} |")
    print(f"| sampled in all | {' | '.join(f'{sum(profiles[way].values()):.0f} us' for way in ways)} |")


def print_table(info: dict[str, str], summary: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}, "
          f"load {info['load']}")
    for size in SIZES:
        row = summary[size]
        print(f"\n{size} bodies\n")
        print("| way | max calls/s (wrk -c 64, best round) | vs proxy | vs proxy, median of rounds | CPU per call | "
              "of which descendants (audit writer) | p99 at one connection (median round) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for way in row["max_calls_per_s"]:
            print(f"| {way} | {row['max_calls_per_s'][way]:.0f} | {row['vs_proxy'][way]:.2f}x | "
                  f"{row['vs_proxy_paired'][way]:.2f}x | "
                  f"{row['cpu_us_per_call'][way]:.0f} us | {row['descendants_cpu_us_per_call'][way]:.1f} us | "
                  f"{row['p99_ms_one_connection'][way]:.2f} ms |")
        spread = ", ".join(f"{cost:+.2f}" for cost in row["audit_cost_p99_ms_rounds"])
        print(f"\naudit trail: {row['audit_cost_throughput']:+.1%} of throughput (best rounds), "
              f"{row['audit_cost_cpu']:+.1%} of CPU a call (median of the rounds), "
              f"{row['audit_cost_p99_ms']:+.2f} ms of p99 at one connection (median of the rounds: {spread})")
    if summary["profiles"]:
        print_profiles(summary["profiles"])
    print()
    for name, met in summary["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wrk-seconds", type=int, default=5, help="wrk duration per way, size and round")
    parser.add_argument("--wrk-rounds", type=int, default=3, help="alternating rounds of wrk -c 64 (best counts)")
    parser.add_argument("--p99-rounds", type=int, default=5,
                        help="alternating rounds at one connection (the median counts)")
    parser.add_argument("--router-flag", action="append", default=[],
                        help="an extra flag for both routers (repeatable), e.g. --router-flag=--workers=2")
    parser.add_argument("--uvloop", action="store_true",
                        help="also the bare proxy and the default router on uvloop (pip install uvloop)")
    parser.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                        help="also sample the proxy's, the floor's and the default router's CPU by owner of the code "
                             "for SECONDS each (needs py-spy: pip install -e '.[bench]')")
    parser.add_argument("--json", type=Path, default=RESULTS / "datapath_bench.json")
    args = parser.parse_args()
    require("wrk", "nginx")
    if args.profile and owners.PY_SPY is None:
        sys.exit("datapath_bench.py --profile needs py-spy: pip install -e '.[bench]'")
    if args.uvloop and importlib.util.find_spec("uvloop") is None:
        sys.exit("datapath_bench.py --uvloop needs uvloop: pip install uvloop")
    info = machine(load=load_average())
    raw = asyncio.run(bench(args, WAYS + UVLOOP_WAYS if args.uvloop else WAYS))
    info["load_after"] = load_average()
    summary = summarize(raw)
    print_table(info, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "settings": {
        "wrk_seconds": args.wrk_seconds, "wrk_rounds": args.wrk_rounds, "p99_rounds": args.p99_rounds,
        "router_flags": args.router_flag, "profile_seconds": args.profile,
        "uvloop": args.uvloop},
        "summary": summary, "raw": raw}, indent=2) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
