"""What the benches share: free ports, the machine's description, wrk (looked for before anything
starts), the echo agent, processes started, awaited and stopped.

Each bench runs as a script, `python bench/<name>.py`, as docs/benchmarks.md (and the walk-throughs
in docs/atp.md and docs/security.md, for the echo agent) write it. Python puts the script's own
directory first on sys.path, so `from common import ...` needs no path insert; the project's
packages come from the venv's editable install, as they do for the tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# The script that runs the echo agent and the bare proxy (`router_bench.py echo|proxy ...`).
ROUTER_BENCH = str(Path(__file__).with_name("router_bench.py"))
# router_bench's payload: every bench that compares routers with it sends the same calls.
PAYLOAD = {"text": "hello, agent", "n": 1}
ECHO_ID = "echo-1"
# The Debian package that installs each tool a bench may need.
DEBIAN_PACKAGES = {"wrk": "wrk", "df": "coreutils", "taskset": "util-linux", "etcd": "etcd-server",
                   "nginx": "nginx-light"}


def require(*tools: str) -> None:
    """Stop with one line saying what to install when a tool the bench drives is missing, before
    anything starts (instead of a FileNotFoundError traceback halfway through)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        packages = " ".join(DEBIAN_PACKAGES[tool] for tool in missing)
        sys.exit(f"{Path(sys.argv[0]).name} needs {', '.join(missing)}: apt-get install {packages}")


def rank_at(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted samples: the one q of the way up (never past the last)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_model() -> str:
    return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor() or "unknown")


def machine(**extra: Any) -> dict[str, Any]:
    """What a figure was measured on; ``extra`` adds what one bench's figures also depend on."""
    return {"cpu": cpu_model(), "cores": str(os.cpu_count()), "python": platform.python_version(),
            "aiohttp": aiohttp.__version__, "kernel": platform.release(), **extra}


# --- wrk ---------------------------------------------------------------------------------------

class WrkRun(NamedTuple):
    calls: int
    rps: float
    latency: dict[int, str]  # percentile -> wrk's own text ("1.23ms")
    non_2xx: int
    socket_errors: str
    cpu_seconds: float | None  # spent by the process ``pid`` and its descendants during the run, when one was given
    own_cpu_seconds: float | None = None  # of which the process ``pid`` itself (the rest: an audit writer, workers)

    def latency_ms(self, percentile: int) -> float:
        value, unit = re.match(r"([\d.]+)(us|ms|s)", self.latency[percentile]).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def post_script(body: bytes | str, headers: dict[str, str] | None = None) -> str:
    """A wrk Lua script that POSTs ``body`` as JSON with ``headers``."""
    text = body.decode() if isinstance(body, bytes) else body
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(text)}",
             'wrk.headers["Content-Type"] = "application/json"']
    lines += [f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}" for name, value in (headers or {}).items()]
    return "\n".join(lines) + "\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def family(pid: int) -> list[int]:
    """``pid`` and its descendants: a router's audit writer, `--workers`' workers and their writers."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(member for child in children for member in family(int(child)))]


def family_cpu_seconds(pid: int) -> float:
    return sum(cpu_seconds(member) for member in family(pid))


def wrk(url: str, script: str, connections: int, seconds: int, pid: int | None = None,
        cpus: str | None = None) -> WrkRun:
    """One closed-loop wrk run (one thread, --latency) driven by the Lua ``script``; with ``pid``,
    also the CPU time that process and its descendants spent during it; with ``cpus`` (taskset's list),
    wrk runs on those CPUs alone."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    try:
        before = family_cpu_seconds(pid) if pid is not None else 0.0
        own_before = cpu_seconds(pid) if pid is not None else 0.0
        pinned = ["taskset", "-c", cpus] if cpus is not None else []
        out = subprocess.run([*pinned, "wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s", "--latency",
                              "-s", handle.name, url], capture_output=True, text=True, check=True).stdout
        spent = family_cpu_seconds(pid) - before if pid is not None else None
        own = cpu_seconds(pid) - own_before if pid is not None else None
    finally:
        os.unlink(handle.name)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: .*", out)
    return WrkRun(calls=int(re.search(r"(\d+) requests in", out).group(1)),
                  rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
                  latency={p: re.search(rf"^\s+{p}%\s+(\S+)", out, re.M).group(1) for p in (50, 75, 90, 99)},
                  non_2xx=int(non_2xx.group(1)) if non_2xx else 0, socket_errors=errors.group(0) if errors else "",
                  cpu_seconds=spent, own_cpu_seconds=own)


def wrk_max(url: str, body: bytes, seconds: int, pid: int, connections: int = 64,
            headers: dict[str, str] | None = None, cpus: str | None = None) -> dict[str, Any]:
    """wrk's calls/s, and the CPU time the serving process spent per call (steadier than calls/s
    on a shared machine: a noisy neighbour lowers calls/s but hardly changes the cost of a call)."""
    run = wrk(url, post_script(body, headers), connections, seconds, pid, cpus)
    assert run.cpu_seconds is not None and run.own_cpu_seconds is not None
    return {"rps": run.rps, "cpu_us_per_call": run.cpu_seconds / run.calls * 1e6,
            "descendants_cpu_us_per_call": (run.cpu_seconds - run.own_cpu_seconds) / run.calls * 1e6,
            "non_2xx": run.non_2xx,
            "socket_errors": run.socket_errors, "p50_ms": run.latency_ms(50), "p99_ms": run.latency_ms(99)}


async def alternating_rounds(targets: dict[str, Callable[[int], dict[str, Any]]], rounds: int,
                             seconds: int) -> dict[str, list[dict[str, Any]]]:
    """A 2 s warm-up run per target, then ``rounds`` rounds of ``targets[name](seconds)`` (run off the loop),
    the order reversed every other round so no target always follows the same neighbour."""
    loop = asyncio.get_running_loop()
    for run in targets.values():
        await loop.run_in_executor(None, run, 2)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for index in range(rounds):
        for name in list(targets) if index % 2 == 0 else list(reversed(targets)):
            result = await loop.run_in_executor(None, targets[name], seconds)
            results[name].append(result)
            print(f"  round {index + 1} {name:>16}: {result['rps']:7.0f} calls/s, "
                  f"{result['cpu_us_per_call']:6.1f} us CPU/call, non-2xx {result['non_2xx']}", file=sys.stderr)
    return results


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as a figure's context."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def best_rounds(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per target, its best round: the most calls/s and the least CPU per call (noise only ever slows)."""
    return {target: {"rps": max(r["rps"] for r in results),
                     "cpu_us_per_call": min(r["cpu_us_per_call"] for r in results),
                     "non_2xx": sum(r["non_2xx"] for r in results), "rounds": results}
            for target, results in rounds.items()}


# --- raw ASGI, for the proxies served by uvicorn ---------------------------------------------------

async def asgi_body(receive: Callable[[], Any], limit: int) -> bytes | None:
    """A request's whole body, from the ASGI messages that carry it; None as soon as it passes ``limit``."""
    parts, size = [], 0
    while True:
        message = await receive()
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
        if not message.get("more_body"):
            return b"".join(parts)


async def asgi_json_answer(send: Callable[[dict[str, Any]], Any], status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


# --- the echo agent ----------------------------------------------------------------------------

def echo_app() -> web.Application:
    async def rest(request: web.Request) -> web.Response:
        raw = await request.read()
        return web.Response(body=b'{"echo":' + (raw or b"null") + b"}", content_type="application/json")

    async def atp(request: web.Request) -> web.Response:
        frame = json.loads(await request.read())
        # Answer with the frame itself, so a reader sees what an atp agent receives.
        answer = {"request_id": frame.get("request_id"), "status": "success",
                  "result": {"echo": frame.get("payload"), "received": frame},
                  "context_update": {"echoed": True}}
        return web.json_response(answer)

    async def words(request: web.Request) -> web.StreamResponse:
        """A rest agent that streams: each word of the payload (a string) as one event, 50 ms apart."""
        return await stream_events(request, str(json.loads(await request.read() or b'""')).split(), 0.05)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/echo", rest)
    app.router.add_post("/words", words)
    app.router.add_post("/atp", atp)
    app.router.add_get("/healthz", healthz)
    return app


async def stream_events(request: web.Request, chunks: list[Any], every_s: float, hold_s: float = 0.0
                        ) -> web.StreamResponse:
    """Answer ``text/event-stream`` as a rest agent may: each chunk a plain ``data:`` event, ``every_s``
    apart, then ``hold_s`` of silence before the end."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n, chunk in enumerate(chunks):
        if n and every_s:
            await asyncio.sleep(every_s)
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await asyncio.sleep(hold_s)
    await response.write_eof()
    return response


# --- processes ---------------------------------------------------------------------------------

def spawn(*args: str) -> subprocess.Popen:
    """This interpreter running ``args`` from the repository root, its stdout discarded."""
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL)


def stop_processes(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(30)


async def wait_http(url: str, timeout: float = 60) -> float:
    """Wait until ``url`` answers 200; returns how long that took."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except aiohttp.ClientError:
                pass
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.01)


async def keep_alive(registry: str, agent_id: str, headers: dict[str, str] | None = None) -> None:
    """Heartbeat ``agent_id`` every 2 s until cancelled."""
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.post(f"{registry}/heartbeat", json={"agent_id": agent_id, "load": 0.0},
                                    headers=headers) as response:
                response.raise_for_status()
            await asyncio.sleep(2)


class RegistryProcess:
    """`agentreach registry` in a process of its own on a free port (auth off, nobody goes silent)."""

    def __init__(self, data_dir: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentreach.cli", "registry", "--port", str(self.port), "--data-dir",
             str(data_dir), "--log-level", "warning", "--silence-timeout", "3600", "--auth", "off", *extra], cwd=ROOT)

    async def wait_ready(self, timeout: float = 120) -> float:
        """Seconds until /healthz answers: the restart time when the data dir holds a log. A registry that
        exits first (a flag it refuses, a traceback) stops the wait at once instead of after ``timeout``."""
        waiting = asyncio.ensure_future(wait_http(f"{self.url}/healthz", timeout))
        while not waiting.done():
            if self.process.poll() is not None:
                waiting.cancel()
                raise RuntimeError(f"registry on port {self.port} exited with {self.process.returncode}")
            await asyncio.wait({waiting}, timeout=0.1)
        return waiting.result()

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
