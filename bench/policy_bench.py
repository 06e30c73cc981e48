"""Policy routing benchmark, one command: `python bench/policy_bench.py [--wrk-seconds 5] [--wrk-rounds 3]`.

One router (`agentreach router --no-audit`, its own process, following `agentreach registry` over its watch
feed, authentication off) and two echo instances (3.2.0 and 3.3.0, one echo process) serving four
capabilities that differ only in their policy, so the only difference between them is the policy's work:

  plain    no policy
  rules    a 10-rule table: nine rules that do not match the call, the tenth matches and routes to ^3
  shadow   the same table and a shadow rule that matches every call (its verdict counted after the call)
  canary   a 95 / 5 split between 3.2 and 3.3 with a rollback rule, a new session_id on every call
  scored   the scored policy (router/scoring.py) with its default weights: plain is least_load, so scored against
           plain is the throughput check of issue 15 (target: >= 0.95x)

wrk (closed loop, 64 connections, alternating rounds, the best counts) gives calls/s per target and the
router's CPU time per call; the table puts each policy beside plain (target: >= 0.9x plain's calls/s).
In process, without sockets (the steadier figure on a busy machine): `Router.call` in a loop with a stub
forwarder, microseconds per call for each policy, shadow verdicts included (`--inproc-calls`, best of five
interleaved passes).
What a shadow rule adds to the live call's latency comes from router_bench's open-loop generator at a
fixed rate (`--rate`, 200/s), rules against shadow, alternating (`--latency-rounds`). JSON in
bench/results/policy_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import aiohttp
import msgspec
from agent_reach.atp import RequestFrame
from agent_reach.registration import Capability

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
from mesh.policy import Policy
from mesh.records import InstanceRecord, instance_key, policy_key
from mesh.watch import InstanceState, Reset
from router.core import Router, RouterSettings
from router.forward import Forwarder
from router.mirror import RegistryMirror
from router.transports.answer import AgentAnswer
from router_bench import run_load

TARGETS = ("plain", "rules", "shadow", "canary", "scored")
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
    "scored": {"policy": "scored"},
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
            latency: dict[str, list[dict[str, Any]]] = {"rules": [], "shadow": []}
            for _ in range(args.latency_rounds):
                for target in latency:
                    frame = json.dumps({"capability": target, "payload": {"text": "hello, agent"},
                                        "context": {"type": "summary"}}).encode()
                    result = await loop.run_in_executor(None, run_load, f"{router}/atp", frame, args.rate, 10, 2)
                    latency[target].append(result)
                    print(f"  {target:>6} @ {args.rate}/s  p50 {result['p50_ms']:.2f} ms  "
                          f"p99 {result['p99_ms']:.2f} ms", file=sys.stderr)
            async with aiohttp.ClientSession() as session, session.get(f"{router}/rules/stats") as response:
                stats = await response.json()
        finally:
            for task in beating:
                task.cancel()
            stop_processes(processes)
    return {"rounds": rounds, "latency": latency, "rule_stats": {"hits": stats["hits"], "shadow": [
        {key: row[key] for key in ("capability", "rule", "agree", "disagree")} for row in stats["shadow"]]}}


class StubForwarder:
    """Answers every call at once: what is left is the router's own work per call."""

    async def send(self, *args: Any, **kwargs: Any) -> AgentAnswer:
        return AgentAnswer(result={"echo": "hello"})


def in_process_mirror() -> RegistryMirror:
    """The bench's two instances and four policies, as a router's mirror holds them."""
    mirror = RegistryMirror()
    records: dict[str, Any] = {}
    for agent_id, version in (("echo-32", "3.2.0"), ("echo-33", "3.3.0")):
        records[instance_key(agent_id)] = InstanceRecord(
            agent_id=agent_id, service="echo", health_url="http://127.0.0.1:9/healthz",
            capabilities=[Capability(name=name, endpoint="http://127.0.0.1:9/echo", protocol="rest", version=version)
                          for name in TARGETS])
    for name, policy in POLICIES.items():
        records[policy_key(name)] = msgspec.convert(policy, Policy)
    healthy = InstanceState("healthy", 0.0, None)
    mirror.apply(Reset(revision=1, records=records, states={"echo-32": healthy, "echo-33": healthy}))
    return mirror


async def in_process(calls: int) -> dict[str, float]:
    """Microseconds of router work per call, per policy: the best of five passes of ``calls`` calls."""
    router = Router(in_process_mirror(), cast(Forwarder, StubForwarder()),
                    RouterSettings(traced_successes_per_second=1))
    best: dict[str, float] = {}
    for _ in range(5):
        for target in TARGETS:
            started = time.perf_counter()
            for n in range(calls):
                await router.call(RequestFrame(capability=target, payload={"text": "hello, agent"},
                                               context={"type": "summary", "session_id": f"s-{n}"}))
                await asyncio.sleep(0)  # a turn of the loop, as between real calls: shadow verdicts run here
            spent = (time.perf_counter() - started) / calls * 1e6
            best[target] = min(best.get(target, spent), spent)
    return best


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
    open_loop = {target: {"p50_ms": min(r["p50_ms"] for r in runs), "p99_ms": min(r["p99_ms"] for r in runs)}
                 for target, runs in raw["latency"].items()}
    return {"best": best, "open_loop": open_loop, "in_process_us": raw["in_process_us"], "targets": {
        "rules_ge_0.9x_plain": best["rules"]["vs_plain"] >= 0.9,
        "canary_ge_0.9x_plain": best["canary"]["vs_plain"] >= 0.9,
        "scored_ge_0.95x_plain": best["scored"]["vs_plain"] >= 0.95,
        "shadow_added_p50_ms": open_loop["shadow"]["p50_ms"] - open_loop["rules"]["p50_ms"],
        "shadow_added_p99_ms": open_loop["shadow"]["p99_ms"] - open_loop["rules"]["p99_ms"]}}


def print_table(info: dict[str, str], summary: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}")
    print()
    print("| policy | max calls/s (wrk -c 64, best round) | vs plain | CPU per call | by CPU vs plain | p50 | p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for target, row in summary["best"].items():
        print(f"| {target} | {row['rps']:.0f} | {row['vs_plain']:.2f}x | {row['cpu_us_per_call']:.0f} us | "
              f"{row['cpu_vs_plain']:.2f}x | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms |")
    print()
    plain_us = summary["in_process_us"]["plain"]
    for target, us in summary["in_process_us"].items():
        print(f"in process, {target}: {us:.1f} us per call (+{us - plain_us:.1f} us over plain)")
    print()
    for target, row in summary["open_loop"].items():
        print(f"open loop, {target}: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms")
    print()
    for name, value in summary["targets"].items():
        print(f"{name}: {value if not isinstance(value, bool) else 'met' if value else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wrk-seconds", type=int, default=5, help="wrk duration per target and round")
    parser.add_argument("--wrk-rounds", type=int, default=3, help="alternating wrk rounds (best counts)")
    parser.add_argument("--inproc-calls", type=int, default=20_000, help="calls per policy per in-process pass")
    parser.add_argument("--rate", type=int, default=200, help="open-loop calls/s for the shadow latency runs")
    parser.add_argument("--latency-rounds", type=int, default=3, help="alternating open-loop rounds (best counts)")
    parser.add_argument("--json", type=Path, default=RESULTS / "policy_bench.json")
    args = parser.parse_args()
    require("wrk")
    info = machine()
    raw = asyncio.run(bench(args))
    raw["in_process_us"] = asyncio.run(in_process(args.inproc_calls))
    summary = summarize(raw)
    print_table(info, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "settings": {
        "wrk_seconds": args.wrk_seconds, "wrk_rounds": args.wrk_rounds, "wrk_connections": 64, "rate": args.rate,
        "latency_rounds": args.latency_rounds},
        "summary": summary, "raw": raw}, indent=2) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
