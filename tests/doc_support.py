"""Running the docs' examples as pasted: `agentreach up` and the echo agent on the documented
ports (or free ones, rewritten into each example), started as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp

from conftest import wait_for
from port_shard import in_shard
from sdk_support import free_port as spare_port

ROOT = Path(__file__).resolve().parents[1]
DOC_PORTS = {"router": 8080, "registry": 8081, "echo": 9000, "agent": 9001}
_DOC_URL = re.compile(r"(localhost|127\.0\.0\.1)(\"?, ?|:)(8080|8081|9000|9001)\b")
VENV_BIN = Path(sys.executable).parent


def free_port(preferred: int) -> int:
    """``preferred`` (the port the docs show) when it is free and this test process's to choose (tests side by
    side split the ports), else another (sdk_support.free_port)."""
    if not in_shard(preferred):
        return spare_port()
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return spare_port()
        return preferred


def agentreach_command() -> list[str]:
    script = Path(sys.executable).parent / "agentreach"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentreach.cli"]


async def wait_up(http: aiohttp.ClientSession, url: str, process: subprocess.Popen) -> None:
    async def up() -> bool:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            async with http.get(url) as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False
    await wait_for(up, timeout=20, what=url)


class DocMesh:
    """`agentreach up` and the echo agent, on ``ports``; ``on_our_ports`` rewrites a doc example."""

    def __init__(self, ports: dict[str, int]):
        self.ports = ports

    def on_our_ports(self, example: str) -> str:
        names = {port: name for name, port in DOC_PORTS.items()}
        return _DOC_URL.sub(lambda match: f"{match.group(1)}{match.group(2)}{self.ports[names[int(match.group(3))]]}",
                            example)

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['registry']}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['router']}"


def doc_environment(mesh: DocMesh) -> dict[str, str]:
    """A shell with the venv active, pointed at ``mesh``'s registry, knowing no admin key but the data dir's."""
    environment = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "AGENTREACH_REGISTRY": mesh.registry_url,
                   "PYTHONUNBUFFERED": "1"}
    environment.pop("AGENTREACH_ADMIN_KEY", None)
    return environment


def venv_commands(commands: str) -> str:
    """Shell lines as the README writes them (`.venv/bin/agentreach`), run from another directory."""
    return commands.replace(".venv/bin/", f"{VENV_BIN}/")


@contextlib.contextmanager
def python_process(cwd: Path, name: str, args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """This interpreter running ``args`` in ``cwd``, its output in ``cwd/<name>.log``; stopped on leaving
    (SIGTERM, as Ctrl-C or a supervisor would)."""
    with open(cwd / f"{name}.log", "wb") as log:
        process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.terminate()
            process.wait(timeout=20)


@contextlib.asynccontextmanager
async def doc_mesh(http: aiohttp.ClientSession, cwd: Path, *up_args: str) -> AsyncIterator[DocMesh]:
    ports = {name: free_port(port) for name, port in DOC_PORTS.items()}
    up = subprocess.Popen([*agentreach_command(), "up", "--registry-port", str(ports["registry"]), "--router-port",
                           str(ports["router"]), "--console-port", str(spare_port()), "--log-level", "warning",
                           *up_args], cwd=cwd)
    echo = subprocess.Popen([sys.executable, "bench/router_bench.py", "echo", "--port", str(ports["echo"])], cwd=ROOT)
    try:
        await wait_up(http, f"http://127.0.0.1:{ports['registry']}/healthz", up)
        await wait_up(http, f"http://127.0.0.1:{ports['router']}/healthz", up)
        await wait_up(http, f"http://127.0.0.1:{ports['echo']}/healthz", echo)
        yield DocMesh(ports)
    finally:
        for process in (up, echo):
            process.terminate()
        for process in (up, echo):
            process.wait(timeout=20)


async def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, env=env)


async def check_curl(mesh: DocMesh, example: str, status: str, promised: list[str]) -> None:
    """Run one curl example on our ports: it must answer ``status`` and name everything ``promised``."""
    result = await run(["bash", "-c", mesh.on_our_ports(example)])
    got = result.stdout.splitlines()[0] if result.stdout else result.stderr
    assert got.startswith(f"HTTP/1.1 {status} "), f"{example}\n-> {result.stdout}{result.stderr}"
    for each in promised:
        assert each in result.stdout, f"{example}\n-> {result.stdout}"


def promised_codes(shown: str) -> list[str]:
    """The error codes an example's shown answer names, which the real answer must name too."""
    return re.findall(r'"error_code":"[A-Z_]+"|"code":-32\d{3}|"error":"[a-z_]+"', shown)
