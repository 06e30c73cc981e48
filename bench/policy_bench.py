"""Policy routing benchmark, one command: `python bench/policy_bench.py [--wrk-seconds 5] [--wrk-rounds 3]`.

One router (`agentreach router --no-audit`, its own process, following `agentreach registry` over its watch
feed, authentication off) and two echo instances (3.2.0 and 3.3.0, one echo process) serving four
capabilities that differ only in their policy, so the only difference between them is the policy's work:

  plain    no policy
  rules    a 10-rule table: nine rules that do not match the call, the tenth matches and routes to ^3
  shadow   the same table and a shadow rule that matches every call (its verdict counted after the call)
  canary   a 95 / 5 split between 3.2 and 3.3 with a rollback rule, a new session_id on every call

wrk (closed loop, 64 connections, alternating rounds, the best counts) gives calls/s and p50/p99 per target
and the router's CPU time per call; the table puts each policy beside plain (target: >= 0.9x plain's
calls/s) and shows what the shadow rule adds to the live call's latency. JSON in
bench/results/policy_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from common import (
    RESULTS,
    ROOT,
    free_port,
    keep_alive,
    machine,
    require,
    spawn,
    stop_processes,
    wait_http,
    wrk,
)

TARGETS = ("plain", "rules", "shadow", "canary")
TEN_RULES = [{"id": f"r{n}", "priority": n * 10, "match": {"context": {"type": f"kind-{n}"}},
              "target": {"version": "^3"}} for n in range(1, 10)] + \
    [{"id": "r10", "priority": 100, "match": {"context": {"type": "summary"}}, "target": {"version": "^3"},
      "reason": "summaries go to any 3.x"}]
POLICIES: dict[str, dict[str, Any]] = {
    "rules": {"rules": TEN_RULES},
    "shadow": {"rules": [*TEN_RULES, {"id": "s0", "priority": 0, "mode": "shadow",
                                      "match": {"context": {"type": "summary"}}, "target": {"version": "3.3"}}]},
    "canary": {"split": [{"version": "3.2", "weight": 95}, {"version": "3.3", "weight": 5}],
               "rollback": {"metric": "error_rate", "worse_than_stable_by": 0.5, "min_calls": 1000,
                            "window_seconds": 60}},
}


def lua(capability: str) -> str:
    """A wrk script POSTing a frame for ``capability`` with a new session_id on every call."""
    head = json.dumps({"capability": capability, "payload": {"text": "hello, agent"}})[:-1]
    return "\n".join([
        'wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"', "counter = 0",
        "request = function()", "  counter = counter + 1",
        f"  return wrk.format(nil, nil, nil, {json.dumps(head)} .. "
        '\',"context":{"type":"summary","session_id":"s-\' .. counter .. \'"}}\')', "end"]) + "\n"


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ports = {name: free_port() for name in ("echo", "registry", "router")}
    echo, registry = f"http://127.0.0.1:{ports['echo']}/echo", f"http://127.0.0.1:{ports['registry']}"
    router = f"http://127.0.0.1:{ports['router']}"
    with tempfile.TemporaryDirectory() as data_dir:
        processes = [
            spawn(str(ROOT / "bench" / "router_bench.py"), "echo", "--port", str(ports["echo"])),  # its echo agent
            spawn("-m", "agentreach.cli", "router", "--port", str(ports["router"]), "--registry", registry,
                  "--log-level", "warning", "--auth", "off", "--data-dir", data_dir, "--no-audit"),
            spawn("-m", "agentreach.cli", "registry", "--port", str(ports["registry"]), "--data-dir", data_dir,
                  "--log-level", "warning", "--auth", "off"),
        ]
        beating: list[asyncio.Task[None]] = []
        try:
            await wait_http(f"http://127.0.0.1:{ports['echo']}/healthz")
            await wait_http(f"{registry}/healthz")
            await wait_http(f"{router}/healthz")
            async with aiohttp.ClientSession() as session:
                for agent_id, version in (("echo-32", "3.2.0"), ("echo-33", "3.3.0")):
                    registration = {"agent_id": agent_id, "service": "echo", "capabilities": [
                        {"name": name, "protocol": "rest", "endpoint": echo, "timeout_sla_ms": 5000,
                         "version": version} for name in TARGETS]}
                    async with session.post(f"{registry}/register", json=registration) as response:
                        response.raise_for_status()
                for name, policy in POLICIES.items():
                    async with session.put(f"{registry}/policies/{name}", json=policy) as response:
                        response.raise_for_status()
            beating = [asyncio.create_task(keep_alive(registry, agent_id)) for agent_id in ("echo-32", "echo-33")]
            await asyncio.sleep(1.0)  # the router sees the instances healthy within a hub tick (0.5 s)
            loop = asyncio.get_running_loop()
            router_pid = processes[1].pid
            rounds: dict[str, list[dict[str, Any]]] = {target: [] for target in TARGETS}
            for _ in range(args.wrk_rounds):
                for target in TARGETS:
                    run = await loop.run_in_executor(None, wrk, f"{router}/atp", lua(target), 64, args.wrk_seconds,
                                                     router_pid)
                    assert run.cpu_seconds is not None
                    result = {"rps": run.rps, "cpu_us_per_call": run.cpu_seconds / run.calls * 1e6,
                              "p50_ms": run.latency_ms(50), "p99_ms": run.latency_ms(99), "non_2xx": run.non_2xx}
                    rounds[target].append(result)
                    print(f"  {target:>6} {run.rps:.0f} calls/s, {result['cpu_us_per_call']:.0f} us CPU/call, "
                          f"p50 {result['p50_ms']:.2f} ms, non-2xx {run.non_2xx}", file=sys.stderr)
            async with aiohttp.ClientSession() as session, session.get(f"{router}/rules/stats") as response:
                stats = await response.json()
        finally:
            for task in beating:
                task.cancel()
            stop_processes(processes)
    return {"rounds": rounds, "rule_stats": {"hits": stats["hits"], "shadow": [
        {key: row[key] for key in ("capability", "rule", "agree", "disagree")} for row in stats["shadow"]]}}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    best = {target: {"rps": max(r["rps"] for r in results),
                     "cpu_us_per_call": min(r["cpu_us_per_call"] for r in results),
                     "p50_ms": min(r["p50_ms"] for r in results), "p99_ms": min(r["p99_ms"] for r in results),
                     "non_2xx": sum(r["non_2xx"] for r in results)}
            for target, results in raw["rounds"].items()}
    plain = best["plain"]
    for figures in best.values():
        figures["vs_plain"] = figures["rps"] / plain["rps"]
        figures["cpu_vs_plain"] = plain["cpu_us_per_call"] / figures["cpu_us_per_call"]
    return {"best": best, "targets": {
        "rules_ge_0.9x_plain": best["rules"]["vs_plain"] >= 0.9,
        "canary_ge_0.9x_plain": best["canary"]["vs_plain"] >= 0.9,
        "shadow_p50_added_ms": best["shadow"]["p50_ms"] - best["rules"]["p50_ms"]}}


def print_table(info: dict[str, str], summary: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}")
    print()
    print("| policy | max calls/s (wrk -c 64, best round) | vs plain | CPU per call | by CPU vs plain | p50 | p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for target, row in summary["best"].items():
        print(f"| {target} | {row['rps']:.0f} | {row['vs_plain']:.2f}x | {row['cpu_us_per_call']:.0f} us | "
              f"{row['cpu_vs_plain']:.2f}x | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms |")
    print()
    for name, value in summary["targets"].items():
        print(f"{name}: {value if not isinstance(value, bool) else 'met' if value else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wrk-seconds", type=int, default=5, help="wrk duration per target and round")
    parser.add_argument("--wrk-rounds", type=int, default=3, help="alternating wrk rounds (best counts)")
    parser.add_argument("--json", type=Path, default=RESULTS / "policy_bench.json")
    args = parser.parse_args()
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
