"""`agentreach router --workers N` (and `up --workers N`): N router processes on one port (SO_REUSEPORT),
supervised by one parent. Real processes on loopback, a real registry, calls over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

import aiohttp
import pytest
from agent_reach.serving import listen
from aiohttp import web

from agentreach.workers import FIRST_RESTART_DELAY, MAX_RESTART_DELAY, restart_delay, worker_settings
from conftest import admin_key, wait_for
from recording_support import Received, RecordingServer
from registry.server import RegistryServer
from router.server import RouterServerSettings
from router_support import capability
from sdk_support import free_port, issue_token

ROOT = Path(__file__).resolve().parents[1]
# Generous: a worker is a fresh interpreter importing the whole router before it listens.
START_TIMEOUT = 60.0


class Supervised:
    """An `agentreach` command run as a subprocess; its JSON log lines are collected as they come (so a
    full pipe never stalls the workers that share its stderr)."""

    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process
        self.records: list[dict[str, Any]] = []
        self.text: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, *args: str, env: dict[str, str] | None = None, own_group: bool = False) -> Self:
        """``own_group``: in a process group of its own, as a shell runs a command in the foreground."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentreach.cli", *args, cwd=ROOT, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(env or {})}, process_group=0 if own_group else None)
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            self.text.append(line.decode())
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.records.append(record)

    def logged(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [record for record in self.records
                if record.get("event") == event and all(record.get(k) == v for k, v in fields.items())]

    async def wait_logged(self, event: str, timeout: float = START_TIMEOUT, **fields: Any) -> dict[str, Any]:
        def found() -> list[dict[str, Any]]:
            if self.process.returncode is not None:
                raise AssertionError(f"exited {self.process.returncode} before logging {event!r}: {self.text[-8:]}")
            return self.logged(event, **fields)
        try:
            return (await wait_for(found, timeout=timeout, what=f"log line {event!r}"))[-1]
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last lines: {self.text[-8:]}") from None

    async def exit_code(self, timeout: float = START_TIMEOUT) -> int:
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await self._reader
        return code

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.exit_code()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def connected_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an open TCP connection to 127.0.0.1:``port`` (from /proc): a
    router worker holds one to an agent it has forwarded a call to (its pool keeps connections alive)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
            return True
    return False


async def register_echo(registry_url: str, agent: Any, token: str | None = None, **fields: Any) -> None:
    """``agent`` registered as `echo` (with a registration token when auth is on, the capability's ``fields``),
    heartbeating once: healthy."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"agent_id": agent.name, "service": "echo", "capabilities": [capability("echo", agent.endpoint, **fields)]}
    async with aiohttp.ClientSession() as http:
        for path, payload in (("/register", body), ("/heartbeat", {"agent_id": agent.name})):
            async with http.post(f"{registry_url}{path}", json=payload, headers=headers) as response:
                assert response.status == 200, await response.text()


async def new_client(http: aiohttp.ClientSession, registry: RegistryServer, key: str) -> str:
    body = {"name": "caller", "trust_level": "internal", "grants": ["echo"]}
    async with http.post(f"{registry.url}/clients", json=body, headers={"X-API-Key": key}) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["api_key"])


class Caller:
    """Calls `echo` through one URL, each call on a connection of its own (so the kernel spreads them
    over the workers), tallying what happened."""

    def __init__(self, url: str, api_key: str):
        self.url = url
        self.api_key = api_key
        self.answered: list[str] = []  # request ids answered 200
        self.failures: list[str] = []  # anything else, described

    async def call(self, request_id: str) -> None:
        frame = {"capability": "echo", "payload": {"n": request_id}, "request_id": request_id}
        connector = aiohttp.TCPConnector(force_close=True)
        try:
            async with aiohttp.ClientSession(connector=connector) as session, session.post(
                    f"{self.url}/atp", json=frame, headers={"X-API-Key": self.api_key}) as response:
                answer = await response.json()
            if response.status == 200 and answer["result"]["echo"] == {"n": request_id}:
                self.answered.append(request_id)
            else:
                self.failures.append(f"{response.status} {answer}")
        except aiohttp.ClientError as exc:
            self.failures.append(repr(exc))

    async def calls(self, prefix: str, count: int) -> None:
        for n in range(count):
            await self.call(f"{prefix}-{n:04d}")


async def until_forwarding(caller: Caller, pids: list[int], agent_port: int, log: Supervised) -> None:
    """Call until every worker in ``pids`` has forwarded a call to the agent; at the deadline, say why not."""
    async def forwarding() -> bool:
        await caller.calls("forwarding", 20)
        return all(connected_to(pid, agent_port) for pid in pids)
    try:
        await wait_for(forwarding, timeout=START_TIMEOUT, what=f"workers {pids} to forward calls")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; forwarding: {[connected_to(pid, agent_port) for pid in pids]}; last failures: "
                             f"{caller.failures[-3:]}; last log lines: {log.text[-6:]}") from None


async def audit_ids(url: str, key: str) -> set[str]:
    """The request ids GET /audit answers, on whichever worker the kernel hands the connection to."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, session.get(
            f"{url}/audit", params={"capability": "echo", "limit": "1000"}, headers={"X-API-Key": key}) as response:
        assert response.status == 200, await response.text()
        return {entry["request_id"] for entry in (await response.json())["entries"]}


async def test_two_workers_share_the_port_and_a_killed_worker_is_restarted(
        start_registry: Callable[..., Awaitable[RegistryServer]], start_agent: Callable[..., Any],
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    registry = await start_registry(auth=True, silence_timeout=60.0, health_interval=60.0)
    key = admin_key(registry)
    agent = await start_agent("echo-1")
    await register_echo(registry.url, agent, (await issue_token(http, registry.url, key, "echo"))["token"])
    api_key = await new_client(http, registry, key)
    port = free_port()
    router = await Supervised.start(
        "router", "--workers", "2", "--port", str(port), "--registry", registry.url, "--data-dir",
        str(tmp_path / "router"), env={"AGENTREACH_ADMIN_KEY": key})
    try:
        pids = (await router.wait_logged("workers ready"))["pids"]
        assert len(pids) == 2 and len(router.logged("router listening")) == 2
        url = f"http://127.0.0.1:{port}"
        # Once each worker has followed the registry and knows the client, both forward calls.
        await until_forwarding(Caller(url, api_key), pids, agent.port, router)

        before = Caller(url, api_key)
        await before.calls("before", 40)
        assert before.failures == [] and len(before.answered) == 40
        # Each worker reads the one shared audit file: every call's row, whichever worker served it, once
        # the worker that served it has written its batch (within its flush interval).
        await wait_for(lambda: _has_all(url, key, set(before.answered)), timeout=10, what="every row in /audit")
        for _ in range(8):  # fresh connections: the kernel hands them to either worker
            assert await _has_all(url, key, set(before.answered))

        # kill -9 one worker while four callers keep calling.
        during = Caller(url, api_key)
        load = [asyncio.create_task(during.calls(f"during-{n}", 40)) for n in range(4)]
        await wait_for(lambda: len(during.answered) > 40, what="load to be under way")
        os.kill(pids[0], signal.SIGKILL)
        restarted = await router.wait_logged("worker restarted", worker=0)
        await asyncio.gather(*load)
        died = router.logged("worker died unexpectedly; restarting", worker=0)
        assert [(record["pid"], record["signal"]) for record in died] == [(pids[0], "SIGKILL")]
        # What can fail is a connection the killed worker held: in flight, or queued on its listening
        # socket until the kernel closed it (a caller may meet that window twice). Each such call fails
        # with the connection reset; no call gets a wrong answer or any other error.
        print(f"calls failed while a worker was killed: {len(during.failures)} of 160: {during.failures}")
        assert len(during.answered) + len(during.failures) == 160
        assert all(failure.startswith(("ServerDisconnectedError", "ClientOSError", "ClientConnectorError"))
                   for failure in during.failures), during.failures

        new_pids = [restarted["pid"], pids[1]]
        after = Caller(url, api_key)
        await until_forwarding(after, new_pids, agent.port, router)
        assert after.failures == []

        # SIGTERM the parent: every worker stops, each having written its audit rows.
        router.process.send_signal(signal.SIGTERM)
        assert await router.exit_code() == 0
        assert not any(alive(pid) for pid in new_pids)
        with sqlite3.connect(tmp_path / "router" / "audit.db") as db:
            kept = {row[0] for row in db.execute("SELECT request_id FROM audit")}
        assert set(before.answered) <= kept and set(after.answered) <= kept
        # A worker killed with -9 loses the rows it had not written yet (at most its last flush interval's).
        print(f"audit rows missing for calls answered while a worker was killed: "
              f"{len(set(during.answered) - kept)} of {len(during.answered)}")
    finally:
        await router.close()


async def _has_all(url: str, key: str, wanted: set[str]) -> bool:
    return wanted <= await audit_ids(url, key)


def test_restarts_back_off_doubling_up_to_a_cap() -> None:
    delays = [restart_delay(n) for n in range(12)]
    assert delays[0] == FIRST_RESTART_DELAY and delays[1] == 2 * FIRST_RESTART_DELAY
    assert delays == sorted(delays) and delays[-1] == MAX_RESTART_DELAY
    assert restart_delay(10_000) == MAX_RESTART_DELAY  # no overflow however long it keeps failing


def test_each_worker_keeps_its_own_signing_keys_and_shares_the_rest(tmp_path: Path) -> None:
    settings = RouterServerSettings(port=8080, keys_dir=tmp_path / "keys", audit_path=tmp_path / "audit.db")
    first, second = worker_settings(settings, 0), worker_settings(settings, 1)
    assert (first.keys_dir, second.keys_dir) == (tmp_path / "keys" / "worker-0", tmp_path / "keys" / "worker-1")
    assert first.reuse_port and second.reuse_port and not settings.reuse_port
    assert first.audit_path == second.audit_path == settings.audit_path and first.port == settings.port
    assert worker_settings(RouterServerSettings(port=8080, keys_dir=None), 1).keys_dir is None


async def test_listen_shares_a_port_only_when_every_listener_asks_to() -> None:
    app = web.Application()
    first, port = await listen(app, "127.0.0.1", 0, reuse_port=True)
    try:
        second, _ = await listen(web.Application(), "127.0.0.1", port, reuse_port=True)
        await second.cleanup()
        with pytest.raises(OSError, match="in use"):
            await listen(web.Application(), "127.0.0.1", port)
    finally:
        await first.cleanup()


async def test_a_worker_that_cannot_start_stops_the_others_and_the_parent_exits_2(
        start_registry: Callable[..., Awaitable[RegistryServer]], tmp_path: Path) -> None:
    registry = await start_registry(auth=True)
    data_dir = tmp_path / "router"
    (data_dir / "keys").mkdir(parents=True)
    (data_dir / "keys" / "worker-1").write_text("not a directory")  # worker 1 cannot keep its signing keys
    router = await Supervised.start("router", "--workers", "2", "--port", str(free_port()), "--registry",
                                    registry.url, "--data-dir", str(data_dir),
                                    env={"AGENTREACH_ADMIN_KEY": admin_key(registry)})
    try:
        assert await router.exit_code() == 2
        assert "router worker(s) [1] failed to start" in "".join(router.text)
        started = [record["pid"] for record in router.logged("worker started")]
        assert len(started) == 2 and not any(alive(pid) for pid in started)
    finally:
        await router.close()


async def test_a_port_already_listened_on_is_refused(registry: RegistryServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", registry.url,
                                        "--auth", "off", "--no-audit")
        try:
            assert await router.exit_code() == 2
        finally:
            await router.close()
    assert f"127.0.0.1:{port} is already in use" in "".join(router.text)
    assert router.logged("worker started") == []


async def test_workers_stop_when_their_parent_is_killed(registry: RegistryServer, tmp_path: Path) -> None:
    router = await Supervised.start("router", "--port", str(free_port()), "--registry", registry.url, "--auth", "off",
                                    "--data-dir", str(tmp_path), env={"AGENTREACH_WORKERS": "2"})
    try:
        pids = (await router.wait_logged("workers ready"))["pids"]
        router.process.kill()
        await wait_for(lambda: not any(alive(pid) for pid in pids), timeout=START_TIMEOUT,
                       what="the orphaned workers to stop")
        assert len(router.logged("the workers' parent is gone: stopping")) == 2
    finally:
        await router.close()


async def test_up_with_workers_runs_the_routers_as_processes_following_the_registry(
        start_agent: Callable[..., Any], tmp_path: Path) -> None:
    registry_port, router_port, console_port = free_port(), free_port(), free_port()
    up = await Supervised.start("up", "--workers", "2", "--auth", "off", "--data-dir", str(tmp_path),
                                "--registry-port", str(registry_port), "--router-port", str(router_port),
                                "--console-port", str(console_port))
    try:
        pids = (await up.wait_logged("workers ready"))["pids"]
        await up.wait_logged("console listening")
        agent = await start_agent("echo-1")
        await register_echo(f"http://127.0.0.1:{registry_port}", agent)
        await until_forwarding(Caller(f"http://127.0.0.1:{router_port}", ""), pids, agent.port, up)
        up.process.send_signal(signal.SIGTERM)
        assert await up.exit_code() == 0
        assert not any(alive(pid) for pid in pids)
    finally:
        await up.close()


@pytest.mark.parametrize(("args", "message"), [
    (["router", "--workers", "0"], "--workers must be from 1 to 64"),
    (["up", "--workers", "65"], "--workers must be from 1 to 64"),
    (["router", "--workers", "2", "--port", "0"], "--workers N needs a port number"),
    (["up", "--workers", "2", "--router-port", "0"], "--workers N needs a port number"),
])
def test_worker_counts_no_router_can_run_with_are_usage_errors(args: list[str], message: str) -> None:
    refused = subprocess.run([sys.executable, "-m", "agentreach.cli", *args], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and message in refused.stderr


async def test_a_router_that_cannot_start_exits_rather_than_hang(tmp_path: Path) -> None:
    """The audit trail opens (a SQLite thread) before the signing keys are read: a start that failed
    after it left that thread running, and the process hung after saying it refused to start."""
    (tmp_path / "keys").write_text("not a directory")
    router = await Supervised.start("router", "--port", "0", "--registry", "http://127.0.0.1:9", "--data-dir",
                                    str(tmp_path), "--admin-key", "ara_unused")
    try:
        assert await router.exit_code() == 2
        assert "refusing to start" in "".join(router.text)
    finally:
        await router.close()


async def test_a_worker_takes_calls_only_once_it_has_the_registrys_view(
        registry: RegistryServer, start_agent: Callable[..., Any], tmp_path: Path) -> None:
    """Its siblings serve the port already (a restart), so a worker that listened before its first sync
    would answer the calls the kernel hands it with errors no caller can retry. Here each worker's watch
    stream is held at a stand-in registry in front of the real one until the test lets it through."""
    agent = await start_agent("echo-1")
    await register_echo(registry.url, agent)
    gate = asyncio.Event()

    async def watch_after_the_gate(request: web.Request, received: Received) -> web.StreamResponse:
        await gate.wait()
        answer = web.StreamResponse()
        await answer.prepare(request)
        async with aiohttp.ClientSession() as session, session.get(f"{registry.url}{request.path_qs}") as upstream:
            async for line in upstream.content:
                await answer.write(line)
        return answer

    stand_in = await RecordingServer(watch_after_the_gate).start()
    port = free_port()
    router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", stand_in.url,
                                    "--auth", "off", "--data-dir", str(tmp_path))
    try:
        await wait_for(lambda: len(stand_in.at("/watch")) == 2, timeout=START_TIMEOUT,
                       what="both workers to ask for the watch feed")
        too_early = Caller(f"http://127.0.0.1:{port}", "")
        await too_early.call("too-early")
        assert too_early.failures[0].startswith("ClientConnectorError"), too_early.failures  # nobody listens yet
        gate.set()
        await router.wait_logged("workers ready")
        caller = Caller(f"http://127.0.0.1:{port}", "")
        await caller.calls("synced", 20)
        assert caller.failures == [] and len(caller.answered) == 20
    finally:
        gate.set()
        await router.close()
        await stand_in.stop()


async def test_ctrl_c_reaches_the_parent_which_stops_the_workers(registry: RegistryServer, tmp_path: Path) -> None:
    """A terminal sends Ctrl-C's SIGINT to its whole foreground process group. Workers in that group
    would stop on their own, racing the parent, which would log them as dead and restart them; in a
    group of their own they stop when the parent tells them to, one by one."""
    router = await Supervised.start("router", "--workers", "2", "--port", str(free_port()), "--registry", registry.url,
                                    "--auth", "off", "--data-dir", str(tmp_path), own_group=True)
    try:
        pids = (await router.wait_logged("workers ready"))["pids"]
        group = os.getpgid(router.process.pid)
        assert all(os.getpgid(pid) != group for pid in pids)
        os.killpg(group, signal.SIGINT)
        assert await router.exit_code() == 0
        assert [record["pid"] for record in router.logged("worker stopped")] == pids
        assert router.logged("worker died unexpectedly; restarting") == []
    finally:
        await router.close()
