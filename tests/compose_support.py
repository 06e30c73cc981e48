"""compose.yaml run without Docker: every service becomes a local process on loopback, started with the
command, environment and volumes the file gives it, in the order its health-conditioned depends_on gives.

The file is read as `docker-compose config` resolves it (anchors, interpolation, absolute volume paths),
so what runs is what compose would run. Only what Docker itself provides is translated: each service's
exposed ports become free loopback ports, service host names and 0.0.0.0 become 127.0.0.1, volumes
become temp dirs (one per source, so a volume two services mount is one dir), the image's executables
(etcd, etcdctl, python, the Dockerfile's ENTRYPOINT) become this machine's. Healthchecks are run as
written, translated the same way, until they pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conftest import wait_for
from sdk_support import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"


def resolved(env: dict[str, str]) -> dict[str, Any]:
    """compose.yaml as `docker-compose config` resolves it with ``env`` (no daemon needed)."""
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=60, check=True)
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT, the command every built service's ``command`` is given to."""
    line = next(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT"))
    words: list[str] = json.loads(line.removeprefix("ENTRYPOINT"))
    return words


def local_ports(exposed: list[int]) -> dict[int, int]:
    """Free loopback ports for a service's exposed ones, keeping their offsets: a service told to use
    P, P+1 and P+2 (the demo agents) finds them consecutive here too."""
    if not exposed:
        return {}
    low, span = min(exposed), max(exposed) - min(exposed) + 1
    while True:
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for offset in range(1, span):
                    held.enter_context(socket.create_server(("127.0.0.1", base + offset)))
            except OSError:
                continue
        return {port: base + port - low for port in exposed}


class LocalMesh:
    """The services of a resolved compose file, run as local processes under ``base``."""

    def __init__(self, config: dict[str, Any], base: Path):
        self.services: dict[str, dict[str, Any]] = config["services"]
        self.base = base
        self.ports = {(name, port): local for name, service in self.services.items()
                      for port, local in local_ports([int(port) for port in service.get("expose", [])]).items()}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.healthy: set[str] = set()

    def url(self, service: str, port: int) -> str:
        return f"http://127.0.0.1:{self.ports[service, port]}"

    def localise(self, service: str, word: str) -> str:
        """One argument or value as it must read on loopback, seen from inside ``service``."""
        def address(match: re.Match[str]) -> str:
            host, port = match[1], int(match[2])
            owner = service if host in ("0.0.0.0", "127.0.0.1", "localhost") else host
            return f"127.0.0.1:{self.ports[owner, port]}" if (owner, port) in self.ports else match[0]
        word = re.sub(r"\b([\w.-]+):(\d+)\b", address, word)
        for target, source in self._volumes(service).items():
            word = re.sub(rf"(^|=){re.escape(target)}(?=/|$)", rf"\g<1>{source}", word)
        return word

    def _volumes(self, service: str) -> dict[str, Path]:
        mounts: dict[str, Path] = {}
        for volume in self.services[service].get("volumes", []):
            source, target = volume.split(":")[:2]
            mounts[target] = self.base / "volumes" / source.strip("/").replace("/", "_")
            mounts[target].mkdir(parents=True, exist_ok=True)
        return mounts

    def command(self, service: str, words: list[str]) -> list[str]:
        """A container command as a local one: the image's executable replaced by this machine's."""
        executable = {"python": sys.executable, "agentreach": str(Path(sys.executable).with_name("agentreach"))}
        first = executable.get(words[0]) or shutil.which(words[0])
        assert first is not None, f"{words[0]} is not installed here"
        localised = [self.localise(service, word) for word in words[1:]]
        for i, word in enumerate(localised[:-1]):  # `--host 0.0.0.0` and `--port N` as separate words
            if (word, localised[i + 1]) == ("--host", "0.0.0.0") or (
                    word == "--advertise-host" and localised[i + 1] in self.services):
                localised[i + 1] = "127.0.0.1"
            elif word == "--port" and (service, int(localised[i + 1])) in self.ports:
                localised[i + 1] = str(self.ports[service, int(localised[i + 1])])
        return [first, *localised]

    def start(self, service: str) -> None:
        spec = self.services[service]
        environment = {key: self.localise(service, str(value)) for key, value in spec.get("environment", {}).items()}
        command = self.command(service, (entrypoint() if "build" in spec else []) + spec["command"])
        log = (self.base / f"{service}.log").open("ab")
        self.processes[service] = subprocess.Popen(command, env={**os.environ, **environment}, cwd=self.base,
                                                   stdout=log, stderr=subprocess.STDOUT)
        log.close()

    async def wait_healthy(self, service: str, timeout: float = 20) -> None:
        """Run the service's own healthcheck until it passes (a process that exits fails at once)."""
        test = self.services[service]["healthcheck"]["test"]
        assert test[0] == "CMD", test
        check = self.command(service, test[1:])

        async def passes() -> bool:
            process = self.processes[service]
            assert process.poll() is None, f"{service} exited: {(self.base / f'{service}.log').read_text()[-2000:]}"
            probe = await asyncio.create_subprocess_exec(*check, stdout=subprocess.DEVNULL,
                                                         stderr=subprocess.DEVNULL)
            return await probe.wait() == 0
        await wait_for(passes, timeout=timeout, interval=0.1, what=f"{service}'s healthcheck")
        self.healthy.add(service)

    async def up(self) -> None:
        """Start every service once each dependency's healthcheck passed; then wait for every one."""
        for name, spec in self.services.items():
            for dependency, condition in spec.get("depends_on", {}).items():
                assert condition == {"condition": "service_healthy"}, (name, dependency, condition)
        pending = dict(self.services)
        while pending:
            ready = [name for name, spec in pending.items()
                     if all(dependency in self.healthy for dependency in spec.get("depends_on", {}))]
            assert ready, f"depends_on never satisfiable: {sorted(pending)}"
            for name in ready:
                self.start(name)
                del pending[name]
            waiting = [name for name in self.processes if name not in self.healthy]
            await asyncio.gather(*(self.wait_healthy(name) for name in waiting))

    def stop(self) -> None:
        for process in reversed(self.processes.values()):
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
