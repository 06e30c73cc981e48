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
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

FRAMES = {
    "exact": {"capability": "demo.echo", "payload": {"text": "hi"}},
    "semantic (cached intent)": {"intent": "say hello back to me", "payload": {"text": "hi"}},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def wrk(url: str, frame: dict, connections: int, seconds: int) -> dict[str, float]:
    script = (f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(frame))}\n'
              'wrk.headers["Content-Type"] = "application/json"\n')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", handle.name, url],
                         capture_output=True, text=True, check=True).stdout
    Path(handle.name).unlink()
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1),
            "p99": re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1),
            "errors": int(non_2xx.group(1)) if non_2xx else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
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
                rows[name] = wrk(url, frame, args.connections, args.seconds)
        finally:
            process.terminate()
            process.wait(30)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"machine: {cpu}, 2 cores, Python {platform.python_version()}; wrk -t1 -c{args.connections}")
    print(f"{'frames':<28}{'calls/s':>10}{'p50':>10}{'p99':>10}{'non-2xx':>9}")
    for name, row in rows.items():
        print(f"{name:<28}{row['rps']:>10.0f}{row['p50']:>10}{row['p99']:>10}{row['errors']:>9}")
    ratio = rows["semantic (cached intent)"]["rps"] / rows["exact"]["rps"]
    print(f"semantic (cached) / exact throughput: {ratio:.2f}x")
    (RESULTS / "semantic_router_bench.json").write_text(json.dumps({"rows": rows, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
