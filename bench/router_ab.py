"""Routers from several git revisions side by side, one command:
`python bench/router_ab.py --rev 215f2f1 --rev hardening-green --rev HEAD [--rounds 5] [--seconds 5]`.
A revision may carry router flags after it, as one argument: `--rev HEAD --rev "HEAD --audit-batch-rows 2000"`
measures one tree's router with and without them side by side.

Each revision is checked out with `git worktree add` into a temporary directory (removed at the end,
also after Ctrl-C or a failure) and runs its own registry and router (`--auth off --no-audit`, the
"router" of bench/router_bench.py; with `--audit`, the audit trail on) from that tree, with this
venv's interpreter and PYTHONPATH=<tree>:<tree>/sdk, so the revision's code shadows the venv's
editable install. One echo
agent and one bare proxy come from the current tree and serve every target.

A comparison across revisions measured one after the other mostly measures the neighbours; here
wrk rounds alternate over all targets (the order reversed every other round), so a burst of load
hits them alike. Per target: the best and the median calls/s, the CPU time per call in the serving
process and its descendants (steadier than calls/s on a shared machine), of which the descendants' (the
audit writer's), and the ratio to the proxy. Results: a table
on stdout and JSON in bench/results/router_ab.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


class Target(NamedTuple):
    pid: int
    url: str
    body: bytes


def git(*args: str) -> str:
    """git's output; when git refuses (an unknown revision), its own message and a stop."""
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextmanager
def worktrees(commits: dict[str, str]) -> Iterator[dict[str, Path]]:
    """Each revision's commit (resolved once, so the table names what ran) checked out in a temporary
    worktree, removed (and unregistered) on the way out."""
    with tempfile.TemporaryDirectory(prefix="router-ab-") as scratch:
        trees: dict[str, Path] = {}
        try:
            for rev, commit in commits.items():
                tree = Path(scratch) / f"{len(trees)}-{commit}"
                git("worktree", "add", "--detach", "--quiet", str(tree), commit)
                trees[rev] = tree
            yield trees
        finally:
            for tree in trees.values():  # each one tried, whatever became of the one before
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


def command_module(tree: Path) -> str:
    """The `agentreach` command moved from console/ to agentreach/ in the refactor (issue 12)."""
    return "agentreach.cli" if (tree / "agentreach" / "cli.py").exists() else "console.cli"


def spawn_in(tree: Path, *args: str) -> subprocess.Popen:
    """This interpreter running ``args`` from ``tree``, its packages (and SDK) found there first."""
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'sdk'}")
    return subprocess.Popen([sys.executable, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL)


async def wait_routable(url: str, body: bytes, timeout: float = 30) -> None:
    """Until the router answers a call 200: it has seen the echo instance healthy on its watch feed."""
    async with aiohttp.ClientSession() as session:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                if response.status == 200:
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"{url} did not route a call (last status {response.status})")
            await asyncio.sleep(0.05)


async def start_revision(tree: Path, data_dir: Path, echo_url: str, processes: list[subprocess.Popen],
                         beats: list[asyncio.Task[None]], audit: bool, flags: list[str]) -> Target:
    """The revision's registry and router, the echo agent registered and kept alive; its target."""
    cli = command_module(tree)
    registry, router = free_port(), free_port()
    registry_url, router_url = f"http://127.0.0.1:{registry}", f"http://127.0.0.1:{router}"
    processes.append(spawn_in(tree, "-m", cli, "registry", "--port", str(registry), "--data-dir", str(data_dir),
                              "--log-level", "warning", "--auth", "off"))
    router_process = spawn_in(tree, "-m", cli, "router", "--port", str(router), "--registry", registry_url,
                              "--log-level", "warning", "--auth", "off", "--data-dir", str(data_dir),
                              *(() if audit else ("--no-audit",)), *flags)
    processes.append(router_process)
    await wait_http(f"{registry_url}/healthz")
    await wait_http(f"{router_url}/healthz")
    registration = {"agent_id": ECHO_ID, "service": "echo", "capabilities": [
        {"name": "echo", "protocol": "rest", "endpoint": echo_url, "timeout_sla_ms": 5000}]}
    async with aiohttp.ClientSession() as session, \
            session.post(f"{registry_url}/register", json=registration) as response:
        response.raise_for_status()
    beats.append(asyncio.create_task(keep_alive(registry_url, ECHO_ID)))
    frame = json.dumps({"capability": "echo", "payload": PAYLOAD}).encode()
    await wait_routable(f"{router_url}/atp", frame)
    return Target(router_process.pid, f"{router_url}/atp", frame)


async def bench(trees: dict[str, Path], rounds: int, seconds: int, audit: bool) -> dict[str, list[dict[str, Any]]]:
    echo, proxy = free_port(), free_port()
    echo_url = f"http://127.0.0.1:{echo}/echo"
    processes = [spawn(ROUTER_BENCH, "echo", "--port", str(echo))]
    beats: list[asyncio.Task[None]] = []
    with tempfile.TemporaryDirectory(prefix="router-ab-data-") as scratch:
        try:
            await wait_http(f"http://127.0.0.1:{echo}/healthz")
            processes.append(spawn(ROUTER_BENCH, "proxy", "--port", str(proxy), "--upstream", echo_url))
            targets = {"proxy": Target(processes[-1].pid, f"http://127.0.0.1:{proxy}/echo",
                                       json.dumps(PAYLOAD).encode())}
            for rev, tree in trees.items():
                data_dir = Path(scratch) / tree.name
                data_dir.mkdir(mode=0o700)
                targets[rev] = await start_revision(tree, data_dir, echo_url, processes, beats, audit, rev.split()[1:])
            await wait_routable(targets["proxy"].url, targets["proxy"].body)
            return await alternating_rounds({name: functools.partial(wrk_max, target.url, target.body, pid=target.pid)
                                             for name, target in targets.items()}, rounds, seconds)
        finally:
            for beat in beats:
                beat.cancel()
            stop_processes(processes)


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per target: best and median calls/s and CPU per call, and each beside the proxy's."""
    summary = {}
    for name, results in rounds.items():
        rps = [r["rps"] for r in results]
        cpu = [r["cpu_us_per_call"] for r in results]
        descendants = [r["descendants_cpu_us_per_call"] for r in results]
        summary[name] = {"best_rps": max(rps), "median_rps": statistics.median(rps), "best_cpu_us": min(cpu),
                         "median_cpu_us": statistics.median(cpu),
                         "median_descendants_cpu_us": statistics.median(descendants),
                         "non_2xx": sum(r["non_2xx"] for r in results)}
    proxy = summary["proxy"]
    for row in summary.values():
        row["best_vs_proxy"] = row["best_rps"] / proxy["best_rps"]
        row["median_vs_proxy"] = row["median_rps"] / proxy["median_rps"]
        row["proxy_cpu_vs_cpu"] = proxy["median_cpu_us"] / row["median_cpu_us"]
    return summary


def print_table(info: dict[str, Any], commits: dict[str, str], summary: dict[str, dict[str, float]]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, aiohttp {info['aiohttp']}, "
          f"load {info['load_before']} before, {info['load_after']} after")
    print()
    print("| target | commit | best calls/s | median calls/s | CPU us/call best | CPU us/call median | "
          "of which descendants (median) | / proxy best | / proxy median | by CPU (median) | non-2xx |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in summary.items():
        print(f"| {name} | {commits.get(name, '-')} | {row['best_rps']:.0f} | {row['median_rps']:.0f} | "
              f"{row['best_cpu_us']:.0f} | {row['median_cpu_us']:.0f} | {row['median_descendants_cpu_us']:.1f} | "
              f"{row['best_vs_proxy']:.2f}x | "
              f"{row['median_vs_proxy']:.2f}x | {row['proxy_cpu_vs_cpu']:.2f}x | {row['non_2xx']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", action="append", required=True,
                        help="a git revision to measure, optionally followed by router flags in the same argument "
                             "(repeat)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating wrk rounds per target")
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per target and round")
    parser.add_argument("--audit", action="store_true",
                        help="routers keep their audit trail (default: --no-audit, routing alone)")
    parser.add_argument("--json", type=Path, default=RESULTS / "router_ab.json")
    args = parser.parse_args()
    if len(set(args.rev)) != len(args.rev) or "proxy" in args.rev:
        parser.error("each --rev once, and none named 'proxy'")
    require("wrk")
    # A SIGTERM unwinds like Ctrl-C, so the processes stop and the worktrees go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    commits = {rev: git("rev-parse", "--short", f"{rev.split()[0]}^{{commit}}") for rev in args.rev}
    info = machine(load_before=load_average())
    with worktrees(commits) as trees:
        rounds = asyncio.run(bench(trees, args.rounds, args.seconds, args.audit))
    info["load_after"] = load_average()
    summary = summarize(rounds)
    print_table(info, commits, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "commits": commits, "settings": {
        "rounds": args.rounds, "seconds": args.seconds, "wrk_connections": 64, "audit": args.audit}, "summary": summary,
        "rounds": rounds}, indent=2) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
