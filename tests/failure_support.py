"""Helpers for the failure tests: steady load that counts every outcome, `agentreach` commands run as
child processes (a router, say; killed with SIGKILL or paused when a test says so, and always killed at
teardown), the etcd leader, and etcd members frozen with SIGSTOP so a registry node is cut off from its
store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from conftest import wait_for
from etcd_support import EtcdCluster
from storage_support import AGENTREACH, Running, start_logged


class Outcome:
    """One call: when it started and ended (monotonic), and what it came to (a label such as "ok",
    an error code, or "no answer within 7s")."""

    __slots__ = ("ended", "label", "started")

    def __init__(self, started: float, ended: float, label: str):
        self.started, self.ended, self.label = started, ended, label


class Tally:
    """Every outcome of a stream of calls, the first message seen for each label, to count and print."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.examples: dict[str, str] = {}

    def record(self, started: float, label: str, message: str = "") -> None:
        self.outcomes.append(Outcome(started, time.monotonic(), label))
        self.examples.setdefault(label, message)

    def counts(self, started_after: float = 0.0, ended_before: float = float("inf")) -> Counter[str]:
        """Labels of the calls that started after ``started_after`` and ended before ``ended_before``."""
        return Counter(o.label for o in self.outcomes if o.started > started_after and o.ended < ended_before)

    def __str__(self) -> str:
        counts = self.counts()
        return "; ".join(f"{label}: {count}" + (f" (e.g. {self.examples[label][:160]})" if self.examples[label]
                                                else "") for label, count in counts.most_common())


class Failed(Exception):
    """What a call raises to be counted as failed under ``label``, its message kept as an example."""

    def __init__(self, label: str, message: str):
        super().__init__(message)
        self.label = label


Call = Callable[[int], Awaitable[str]]


async def steady(call: Call, tally: Tally, *, rate: float, concurrency: int, deadline: float,
                 stop: asyncio.Event) -> None:
    """Start ``call(n)`` ``rate`` times a second, at most ``concurrency`` at once, until ``stop`` is set;
    record what each returned (its label), the label of the :class:`Failed` it raised, any other
    exception's type (a failure the caller was not told about the way it expects) or a call still
    unanswered after ``deadline`` seconds (a hang).
    Returns once every call started has ended."""
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    async def one(n: int) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                label = await call(n)
            tally.record(started, label)
        except Failed as failure:
            tally.record(started, failure.label, str(failure))
        except TimeoutError:
            tally.record(started, f"no answer within {deadline}s")
        except Exception as exc:
            tally.record(started, f"raised {type(exc).__name__}", str(exc))
        finally:
            slots.release()

    n = 0
    next_start = time.monotonic()
    while not stop.is_set():
        await slots.acquire()
        task = asyncio.create_task(one(n))
        running.add(task)
        task.add_done_callback(running.discard)
        n += 1
        next_start += 1 / rate
        # Pacing the load, not waiting for a condition: the stop event ends it at once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_start - time.monotonic()))
    await asyncio.gather(*running)


@contextlib.asynccontextmanager
async def steady_load(call: Call, *, rate: float, concurrency: int, deadline: float) -> AsyncIterator[Tally]:
    """``steady`` in the background for the block; on leaving, the calls stop and every one started ends."""
    tally, stop = Tally(), asyncio.Event()
    driving = asyncio.create_task(steady(call, tally, rate=rate, concurrency=concurrency, deadline=deadline,
                                         stop=stop))
    try:
        yield tally
    finally:
        stop.set()
        await driving


async def routes(http: aiohttp.ClientSession, router_url: str, capability: str,
                 headers: dict[str, str] | None = None) -> None:
    """Wait until a call to ``capability`` (with ``headers``: a caller's key) through ``router_url``
    succeeds: it follows the registry, and knows the caller."""
    async def answered() -> bool:
        async with http.post(f"{router_url}/atp", json={"capability": capability, "payload": "ready?"},
                             headers=headers) as response:
            return response.status == 200
    await wait_for(answered, timeout=15, what=f"{router_url} to route {capability}")


class ChildProcess:
    """A started `agentreach` command: where it listens, kill -9, and SIGSTOP/SIGCONT."""

    def __init__(self, running: Running):
        self.running = running

    @property
    def url(self) -> str:
        return self.running.url

    def kill(self) -> None:
        """kill -9: no graceful close, every connection to it dropped by the kernel."""
        self.running.process.kill()
        self.running.process.wait()

    def pause(self) -> None:
        os.kill(self.running.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.running.process.pid, signal.SIGCONT)


StartChild = Callable[[list[str], str], Awaitable[ChildProcess]]


@pytest.fixture
async def child_process() -> AsyncIterator[StartChild]:
    """``await child_process(command, ready)``: ``command`` running once it logged the event ``ready``;
    every one still running is killed at teardown (resumed first, were it paused), whatever the test did."""
    started: list[ChildProcess] = []

    async def start(command: list[str], ready: str) -> ChildProcess:
        # In a thread: what it talks to at start (a registry) may be served by this test's own event loop.
        started.append(ChildProcess(await asyncio.to_thread(start_logged, command, ready=ready)))
        return started[-1]

    try:
        yield start
    finally:
        for child in started:
            if child.running.process.poll() is None:
                child.resume()
                child.kill()


@pytest.fixture
def router_process(child_process: StartChild, tmp_path: Path) -> Callable[..., Awaitable[ChildProcess]]:
    """``await router_process("http://registry,...", *flags)``: `agentreach router` following those
    registries (no audit; auth off unless ``flags`` say ``--auth on --admin-key KEY``)."""
    async def start(registry: str, *flags: str) -> ChildProcess:
        data_dir = tmp_path / f"router-{time.monotonic_ns()}"
        return await child_process([*AGENTREACH, "router", "--port", "0", "--registry", registry, "--auth", "off",
                                    "--no-audit", "--data-dir", str(data_dir), *flags], "router listening")

    return start


async def leader(cluster: EtcdCluster, http: aiohttp.ClientSession) -> int:
    """The index of the member leading the cluster's raft now."""
    ids, leaders = {}, set()
    for i, endpoint in enumerate(cluster.endpoints):
        if cluster.processes[i] is not None:
            async with http.post(f"{endpoint}/v3/maintenance/status", json={}) as response:
                status = await response.json()
            ids[status["header"]["member_id"]] = i
            leaders.add(status["leader"])
    [leading] = leaders
    return ids[leading]


@contextlib.contextmanager
def frozen(cluster: EtcdCluster, *members: int) -> Iterator[None]:
    """SIGSTOP the etcd ``members`` for the block, SIGCONT after it, even when the block fails: their
    sockets stay open and accept connections, but nothing is answered (a hung peer, not a dead one)."""
    pids = []
    for i in members:
        process = cluster.processes[i]
        assert process is not None, f"etcd member {i} is not running"
        pids.append(process.pid)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
