"""Router throughput with semantic matching (cached intents) vs exact names, side by side.

    python bench/semantic_router_bench.py [--seconds 8] [--connections 16]

Starts `agentreach up --demo` (semantic matching on, three demo SDK agents) on free ports, then
drives the router with wrk (its own process): frames naming `demo.echo`, and frames saying
"say hello back to me" instead, which the router matches to `demo.echo` (after the first call
the intent's vector comes from the cache). Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from common import RESULTS, ROOT, free_port, machine, post_script, require, wrk

FRAMES = {
    "exact": {"capability": "demo.echo", "payload": {"text": "hi"}},
    "semantic (cached intent)": {"intent": "say hello back to me", "payload": {"text": "hi"}},
}


def post(url: str, frame: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(frame).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_routable(url: str, frame: dict, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return post(url, frame)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wrk_frames(url: str, frame: dict, connections: int, seconds: int) -> dict[str, Any]:
    run = wrk(url, post_script(json.dumps(frame)), connections, seconds)
    return {"rps": run.rps, "p50": run.latency[50], "p99": run.latency[99], "errors": run.non_2xx}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    require("wrk")
    RESULTS.mkdir(parents=True, exist_ok=True)
    registry_port, router_port, console_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(dir=RESULTS) as data_dir:
        process = subprocess.Popen([sys.executable, "-m", "agentreach.cli", "up", "--demo", "--data-dir", data_dir,
                                    "--registry-port", str(registry_port), "--router-port", str(router_port),
                                    "--console-port", str(console_port), "--log-level", "warning", "--auth", "off"],
                                   cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{router_port}/atp"
            rows = {}
            for name, frame in FRAMES.items():
                answer = wait_routable(url, frame)
                assert answer.get("route", {}).get("capability") == "demo.echo", answer
                rows[name] = wrk_frames(url, frame, args.connections, args.seconds)
        finally:
            process.terminate()
            process.wait(30)
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}; wrk -t1 -c{args.connections}")
    print(f"{'frames':<28}{'calls/s':>10}{'p50':>10}{'p99':>10}{'non-2xx':>9}")
    for name, row in rows.items():
        print(f"{name:<28}{row['rps']:>10.0f}{row['p50']:>10}{row['p99']:>10}{row['errors']:>9}")
    ratio = rows["semantic (cached intent)"]["rps"] / rows["exact"]["rps"]
    print(f"semantic (cached) / exact throughput: {ratio:.2f}x")
    (RESULTS / "semantic_router_bench.json").write_text(json.dumps({"rows": rows, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
