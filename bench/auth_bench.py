"""Router throughput with caller authentication, one command: `python bench/auth_bench.py [--wrk-rounds 3]`.

In one run, against the same echo agent (bench/common.py's, as bench/router_bench.py uses, in its own process),
four ways through a router (each router in a process of its own, following one registry with
auth on over its watch feed; the agent joined with a registration token, so every way signs what
it forwards):

  off      a router with auth off: no credential
  api_key  a router with auth on, each call carrying `X-API-Key`
  jwt      the same router, each call carrying `Authorization: Bearer <JWT from /oauth/token>`
  audited  a router with auth on and the audit trail on (SQLite), each call carrying `X-API-Key`

Maximum calls/s comes from wrk (closed loop, 64 connections, rounds alternating the ways, the
best round counts), with the CPU time the router process spent per call beside it: on a shared
machine that is the steadier number. Target: api_key and jwt ≥ 0.9x off. Results: a table on
stdout and JSON in bench/results/auth_bench.json.

Subcommands used by the run: `registry --port P --data-dir D` (auth on) and
`router --port P --registry URL --registry-key K --auth on|off [--audit PATH]`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from common import (
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
from registry.access import read_admin_key

WAYS = ("off", "api_key", "jwt", "audited")
BODY = json.dumps({"capability": "echo", "payload": {"text": "hello, agent", "n": 1}})

async def enrol(session: aiohttp.ClientSession, registry: str, echo: str,
                admin: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Register the echo agent with a registration token and make a client granted `echo`: the client
    (its api_key, client_id, client_secret) and the registration token's header (for the heartbeats)."""
    async with session.post(f"{registry}/tokens", json={"service": "echo"}, headers=admin) as response:
        response.raise_for_status()
        token = {"Authorization": f"Bearer {(await response.json())['token']}"}
    registration = {"agent_id": "echo-1", "service": "echo", "capabilities": [
        {"name": "echo", "protocol": "rest", "endpoint": f"{echo}/echo", "timeout_sla_ms": 5000}]}
    async with session.post(f"{registry}/register", json=registration, headers=token) as response:
        response.raise_for_status()
    client_body = {"name": "bench", "trust_level": "internal", "grants": ["echo"]}
    async with session.post(f"{registry}/clients", json=client_body, headers=admin) as response:
        response.raise_for_status()
        return await response.json(), token


async def prepare(session: aiohttp.ClientSession, registry: str, routers: dict[str, str], echo: str,
                  admin: dict[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Enrol the echo agent and a client, get its JWT; the headers each way sends, and the registration
    token (for the heartbeats)."""
    client, token = await enrol(session, registry, echo, admin)
    headers = {"off": {}, "api_key": {"X-API-Key": client["api_key"]}, "audited": {"X-API-Key": client["api_key"]}}
    for _ in range(200):  # the router learns the client from the watch feed
        async with session.post(f"{routers['api_key']}/oauth/token", data={
                "grant_type": "client_credentials", "client_id": client["client_id"],
                "client_secret": client["client_secret"]}) as response:
            if response.status == 200:
                headers["jwt"] = {"Authorization": f"Bearer {(await response.json())['access_token']}"}
                break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError("the router never learned the bench client")
    for way in WAYS:  # every way answers 200 before it is measured
        url = routers[way]
        for _ in range(200):
            async with session.post(f"{url}/atp", data=BODY, headers={"Content-Type": "application/json",
                                                                      **headers[way]}) as response:
                if response.status == 200:
                    break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"{way}: the router never routed the bench call")
    return headers, token


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ports = {name: free_port() for name in ("echo", "registry", "off", "on", "audited")}
    echo, registry = (f"http://127.0.0.1:{ports[name]}" for name in ("echo", "registry"))
    routers = {"off": f"http://127.0.0.1:{ports['off']}", "api_key": f"http://127.0.0.1:{ports['on']}",
               "audited": f"http://127.0.0.1:{ports['audited']}"}
    routers["jwt"] = routers["api_key"]
    with tempfile.TemporaryDirectory() as data_dir:
        processes = [spawn(__file__, "echo", "--port", str(ports["echo"])),
                     spawn(__file__, "registry", "--port", str(ports["registry"]), "--data-dir", data_dir)]
        beating: asyncio.Task[None] | None = None
        try:
            await wait_http(f"{echo}/healthz")
            await wait_http(f"{registry}/healthz")
            admin_key = read_admin_key(Path(data_dir))
            if admin_key is None:
                raise RuntimeError("the registry wrote no admin key")
            admin = {"X-API-Key": admin_key}
            for auth, port, audit in (("off", ports["off"], []), ("on", ports["on"], []),
                                      ("on", ports["audited"], ["--audit", str(Path(data_dir) / "audit.db")])):
                processes.append(spawn(__file__, "router", "--port", str(port), "--registry", registry,
                                       "--registry-key", admin["X-API-Key"], "--auth", auth, *audit))
            pids = {"off": processes[2].pid, "api_key": processes[3].pid, "jwt": processes[3].pid,
                    "audited": processes[4].pid}
            for url in set(routers.values()):
                await wait_http(f"{url}/healthz")
            async with aiohttp.ClientSession() as session:
                headers, token = await prepare(session, registry, routers, echo, admin)
                beating = asyncio.create_task(keep_alive(registry, "echo-1", token))
                loop = asyncio.get_running_loop()
                rounds: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
                for _ in range(args.wrk_rounds):
                    for way in WAYS:
                        result = await loop.run_in_executor(None, functools.partial(
                            wrk_max, f"{routers[way]}/atp", BODY.encode(), args.wrk_seconds, pids[way],
                            headers=headers[way]))
                        rounds[way].append(result)
                        print(f"  {way:>7} max {result['rps']:.0f} calls/s, {result['cpu_us_per_call']:.0f} us "
                              f"CPU/call, non-2xx {result['non_2xx']}", file=sys.stderr)
                beating.cancel()
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
    return best_rounds(rounds)


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    off = raw["off"]
    ratios = {way: raw[way]["rps"] / off["rps"] for way in WAYS}
    cpu_ratios = {way: off["cpu_us_per_call"] / raw[way]["cpu_us_per_call"] for way in WAYS}
    return {"max_calls_per_s": {way: raw[way]["rps"] for way in WAYS},
            "cpu_us_per_call": {way: raw[way]["cpu_us_per_call"] for way in WAYS},
            "throughput_vs_off": ratios, "cpu_ratio_vs_off": cpu_ratios,
            "targets": {f"{way}_ge_0.9x_off": ratios[way] >= 0.9 for way in ("api_key", "jwt")}}


def print_table(info: dict[str, str], summary: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}")
    print()
    print("| auth | max calls/s (wrk -c 64, best round) | vs off | CPU per call in the router | vs off (by CPU) |")
    print("|---|---:|---:|---:|---:|")
    for way in WAYS:
        print(f"| {way} | {summary['max_calls_per_s'][way]:.0f} | {summary['throughput_vs_off'][way]:.2f}x | "
              f"{summary['cpu_us_per_call'][way]:.0f} us | {summary['cpu_ratio_vs_off'][way]:.2f}x |")
    print()
    for name, met in summary["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")


async def serve_registry(port: int, data_dir: Path) -> None:
    from registry.server import RegistryServer, RegistrySettings
    server = RegistryServer(RegistrySettings(data_dir=data_dir, port=port, auth=True))
    await server.start()
    await asyncio.Event().wait()


async def serve_router(port: int, registry: str, registry_key: str, auth: bool, audit: Path | None) -> None:
    from router.server import RouterServer, RouterServerSettings
    server = RouterServer(RouterServerSettings(port=port, registry_url=registry, registry_key=registry_key,
                                               auth=auth, audit_path=audit))
    await server.start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="the whole benchmark (the default)")
    for command in (parser, run):
        command.add_argument("--wrk-seconds", type=int, default=5, help="wrk duration per way and round")
        command.add_argument("--wrk-rounds", type=int, default=3, help="alternating wrk rounds (best counts)")
        command.add_argument("--json", type=Path, default=RESULTS / "auth_bench.json")
    echo = commands.add_parser("echo", help="run the echo agent")
    echo.add_argument("--port", type=int, required=True)
    registry = commands.add_parser("registry", help="run a registry with auth on")
    registry.add_argument("--port", type=int, required=True)
    registry.add_argument("--data-dir", type=Path, required=True)
    router = commands.add_parser("router", help="run a router following a registry over HTTP")
    router.add_argument("--port", type=int, required=True)
    router.add_argument("--registry", required=True)
    router.add_argument("--registry-key", required=True)
    router.add_argument("--auth", choices=["on", "off"], required=True)
    router.add_argument("--audit", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "echo":
        from aiohttp import web
        web.run_app(echo_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)
    elif args.command == "registry":
        asyncio.run(serve_registry(args.port, args.data_dir))
    elif args.command == "router":
        asyncio.run(serve_router(args.port, args.registry, args.registry_key, args.auth == "on", args.audit))
    else:
        require("wrk")
        info = machine()
        raw = asyncio.run(bench(args))
        summary = summarize(raw)
        print_table(info, summary)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "settings": {
            "wrk_seconds": args.wrk_seconds, "wrk_rounds": args.wrk_rounds, "wrk_connections": 64},
            "summary": summary, "raw": raw}, indent=2) + "\n")
        print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
