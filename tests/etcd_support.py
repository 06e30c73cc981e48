"""A real 3-member etcd cluster on loopback: free ports, temp data dirs, members killed and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import wait_for
from registry.server import RegistryServer, RegistrySettings
from sdk_support import loopback_socket

# Fresh ports for a cluster whose chosen ones another process bound first.
PORT_ATTEMPTS = 3
# One member's health answer at most: a poll that hangs on one member would never notice another's exit.
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=2)


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each is held until all are chosen, so none is handed out twice."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(loopback_socket()) for _ in range(count)]
        return [int(sock.getsockname()[1]) for sock in sockets]


class PortTaken(Exception):
    """A member exited because another process bound one of its ports between their choice and etcd's bind."""


class EtcdCluster:
    """Three etcd members; ``kill(i)`` and ``start(i)`` take one down and bring it back on its data dir."""

    def __init__(self, base: Path, size: int = 3):
        self.base = base
        self.names = [f"m{i}" for i in range(size)]
        ports = _free_ports(2 * size)
        self.client_ports, self.peer_ports = ports[:size], ports[size:]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.initial = ",".join(f"{name}=http://127.0.0.1:{port}"
                                for name, port in zip(self.names, self.peer_ports, strict=True))

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.client_ports]

    def start(self, i: int) -> None:
        log = (self.base / f"{self.names[i]}.log").open("ab")
        self.processes[i] = subprocess.Popen(
            ["etcd", "--name", self.names[i], "--data-dir", str(self.base / self.names[i]),
             "--listen-client-urls", self.endpoints[i], "--advertise-client-urls", self.endpoints[i],
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", self.base.name,
             # Short raft timers: a lost leader is replaced, and quorum regained, quickly.
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self, i: int) -> None:
        process = self.processes[i]
        assert process is not None
        process.kill()
        process.wait()
        self.processes[i] = None

    async def healthy(self, http: aiohttp.ClientSession) -> None:
        """Wait until every running member reports health (a leader and quorum); PortTaken at once when a
        member could not bind its ports."""
        async def all_healthy() -> bool:
            if self._lost_a_port():
                raise PortTaken(f"an etcd member of {self.base} found its port taken (see its log)")
            for i, process in enumerate(self.processes):
                if process is None:
                    continue
                try:
                    async with http.get(self.endpoints[i] + "/health", timeout=HEALTH_TIMEOUT) as response:
                        if (await response.json(content_type=None)).get("health") != "true":
                            return False
                except (aiohttp.ClientError, TimeoutError, ValueError):  # whatever answers there is not etcd yet
                    return False
            return True
        await wait_for(all_healthy, timeout=30, interval=0.05, what="etcd members healthy")

    def _lost_a_port(self) -> bool:
        return any(process is not None and process.poll() is not None
                   and b"address already in use" in (self.base / f"{name}.log").read_bytes()
                   for process, name in zip(self.processes, self.names, strict=True))

    def stop(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None:
                self.kill(i)


@pytest.fixture
async def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Callable[[], Awaitable[EtcdCluster]]]:
    """Start fresh 3-member clusters; each is killed at teardown. Tests that kill members get their own."""
    clusters: list[EtcdCluster] = []

    async def start() -> EtcdCluster:
        """A healthy cluster; on new ports when another process took one of the chosen ones first."""
        attempt = 1
        while True:
            cluster = EtcdCluster(tmp_path_factory.mktemp(f"etcd{time.monotonic_ns()}"))
            clusters.append(cluster)
            for i in range(len(cluster.names)):
                cluster.start(i)
            try:
                async with aiohttp.ClientSession() as http:
                    await cluster.healthy(http)
            except PortTaken:
                cluster.stop()
                if attempt == PORT_ATTEMPTS:
                    raise
                attempt += 1
            else:
                return cluster

    yield start
    for cluster in clusters:
        await asyncio.get_running_loop().run_in_executor(None, cluster.stop)


@pytest.fixture
async def etcd_registry(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[RegistryServer]]]:
    """Start registries in etcd mode under this test's own key prefix (one data dir: they share the
    secrets key), talking to every member or only to ``endpoints``; each stops at teardown."""
    async with contextlib.AsyncExitStack() as stopping:
        async def start(cluster: EtcdCluster, endpoints: list[str] | None = None, **knobs: Any) -> RegistryServer:
            """``knobs``: RegistrySettings fields (node_ttl, lifecycle...) for this node."""
            settings = {"data_dir": tmp_path / "data", "port": 0, "auth": False, "store": "etcd",
                        "etcd_endpoints": endpoints or cluster.endpoints, "etcd_prefix": f"/{tmp_path.name}/",
                        "etcd_timeout": 2.0, **knobs}
            server = RegistryServer(RegistrySettings(**settings))
            await server.start()
            stopping.push_async_callback(server.stop)
            return server

        yield start


class Relay:
    """A TCP relay to one etcd member that can be cut (every connection closed, none accepted) and
    restored on the same port: one client loses etcd while the cluster goes on. ``lag``: seconds every
    answer from etcd takes on its way back (a slow link: this client's watch runs behind the cluster)."""

    def __init__(self, target_port: int, lag: float = 0.0):
        self.target_port = target_port
        self.lag = lag
        self.port = _free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, upstream_writer}
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer, self.lag))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lag: float = 0.0) -> None:
        try:
            while data := await reader.read(65536):
                if lag:
                    await asyncio.sleep(lag)  # the link's latency itself, not a wait for some condition
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def relay() -> AsyncIterator[Callable[..., Awaitable[Relay]]]:
    relays: list[Relay] = []

    async def start(target_port: int, lag: float = 0.0) -> Relay:
        relays.append(Relay(target_port, lag))
        await relays[-1].restore()
        return relays[-1]

    yield start
    for each in relays:
        if each._server is not None and each._server.is_serving():
            await each.cut()
