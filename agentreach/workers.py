"""`--workers N`: N router processes on one port (SO_REUSEPORT), started, watched and stopped by one parent.

Workers are spawned (multiprocessing's "spawn"), not forked: the parent of `agentreach up` runs an
event loop and aiosqlite's threads, which a fork would copy mid-flight. A worker receives its
settings as one pickled msgspec Struct, so every router knob reaches it exactly as parsed, with no
command line rebuilt from them. Each worker holds one end of a pipe to the parent: it writes
"ready" there once it listens, and reads EOF there when the parent is gone (killed with -9, say),
so no orphan keeps serving on the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import msgspec
from agent_reach import logs
from agent_reach.serving import cancel

from router.server import RouterServerSettings
from router.worker_views import WorkerViews

log = logging.getLogger("agentreach.workers")

READY = b"ready"
FIRST_RESTART_DELAY = 0.5
MAX_RESTART_DELAY = 30.0
# A worker that served this long before it died was not failing at start: its restart is quick again.
STABLE_AFTER = 30.0
# Seconds a worker has to finish its calls and its audit rows after SIGTERM, before SIGKILL.
STOP_GRACE = 15.0

# What a worker runs: given its index and its end of the pipe, it serves until told to stop; the exit code.
Target = Callable[[int, Connection], int]


class WorkerFailed(Exception):
    """A worker died before it listened: the parent stops the others and refuses to start (exit 2)."""


def restart_delay(quick_deaths: int) -> float:
    """Seconds before restarting a worker that died ``quick_deaths`` times in a row soon after starting:
    doubling from FIRST_RESTART_DELAY, so a worker that cannot start does not spin."""
    return min(MAX_RESTART_DELAY, FIRST_RESTART_DELAY * 2.0 ** min(quick_deaths, 16))


def worker_settings(settings: RouterServerSettings, index: int) -> RouterServerSettings:
    """Worker ``index``'s router: on the shared port, with signing keys of its own kept across its restarts
    (DATA_DIR/keys/worker-<index>). A key ring rotates and prunes its directory as if it were alone, so
    two rings sharing one would shorten each other's keys' lives. Everything else, the audit trail's
    file included, is shared."""
    keys_dir = settings.keys_dir / f"worker-{index}" if settings.keys_dir is not None else None
    views = msgspec.structs.replace(settings.views, index=index) if settings.views is not None else None
    return msgspec.structs.replace(settings, keys_dir=keys_dir, reuse_port=True, views=views)


def new_views(count: int) -> WorkerViews:
    """A directory for ``count`` workers' private sockets (router/worker_views.py), made for this run: mode 0700
    under the temporary directory (a data dir's path may be past a unix socket path's 108 bytes)."""
    return WorkerViews(directory=Path(tempfile.mkdtemp(prefix="agentreach-workers-")), count=count)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on. With SO_REUSEPORT the workers would otherwise join
    another process's listeners (say, a second `--workers` router of this user) and silently take half
    its traffic, instead of failing as one router does."""
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio binds: TIME_WAIT owns nothing
            try:
                probe.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"{host}:{port} is already in use ({exc.strerror})") from exc


class ProcessSetup(msgspec.Struct, frozen=True):
    """What a spawned process does not inherit and is told instead: it starts as a fresh interpreter."""

    log_level: str
    gc_threshold: tuple[int, int, int]

    @classmethod
    def of_this_process(cls) -> ProcessSetup:
        level = logging.getLevelName(logging.getLogger("agentreach").getEffectiveLevel())
        return cls(log_level=level, gc_threshold=gc.get_threshold())

    def apply(self, index: int) -> None:
        """JSON logs at the parent's level, each line saying which worker wrote it; the parent's GC tuning."""
        logs.configure(self.log_level)

        def tag(record: logging.LogRecord) -> bool:
            record.worker = index
            return True

        logging.getLogger("agentreach").handlers[0].addFilter(tag)
        gc.set_threshold(*self.gc_threshold)


def _child(setup: ProcessSetup, target: Target, index: int, link: Connection) -> None:
    # Out of the parent's process group, so a terminal's Ctrl-C (sent to the whole group) reaches the
    # parent alone, which stops the workers itself instead of racing them and restarting the first to go.
    os.setpgrp()
    setup.apply(index)
    sys.exit(target(index, link))


class SupervisorLink:
    """A worker's end of its pipe, started last among the worker's parts: says "ready" once everything
    before it listens, and stops the worker when the parent is gone (the pipe's EOF)."""

    def __init__(self, link: Connection):
        self._link = link

    async def start(self) -> None:
        self._link.send_bytes(READY)
        asyncio.get_running_loop().add_reader(self._link.fileno(), self._parent_gone)

    def _parent_gone(self) -> None:
        asyncio.get_running_loop().remove_reader(self._link.fileno())
        log.warning("the workers' parent is gone: stopping")
        signal.raise_signal(signal.SIGTERM)  # the way the parent would have stopped us

    async def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # already closed, or the reader already removed
            asyncio.get_running_loop().remove_reader(self._link.fileno())
        self._link.close()


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await readable
    finally:
        loop.remove_reader(fd)


class _Worker:
    """One running worker process as the parent sees it."""

    def __init__(self, index: int, process: BaseProcess, link: Connection):
        self.index = index
        self.process = process
        self.link = link
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    async def ready(self) -> bool:
        """True once it says it listens; False when it died first (its end of the pipe closed)."""
        await _readable(self.link.fileno())
        try:
            return self.link.recv_bytes() == READY
        except (EOFError, OSError):
            return False

    async def exited(self) -> int:
        await _readable(self.process.sentinel)
        self.process.join()
        code = self.process.exitcode
        assert code is not None
        return code

    def close(self) -> None:
        self.link.close()
        self.process.close()


def _exit_fields(code: int) -> dict[str, object]:
    """A worker's exit as log fields: its exit code, or the signal that killed it."""
    return {"signal": signal.Signals(-code).name} if code < 0 else {"exit_code": code}


class WorkerPool:
    """``count`` processes running ``target``: started together, each restarted (with backoff) when it
    dies unexpectedly, stopped together with SIGTERM."""

    def __init__(self, target: Target, count: int, private_dir: Path | None = None):
        """``private_dir``: the workers' own directory, removed once they have all stopped."""
        self._target = target
        self._count = count
        self._private_dir = private_dir
        self._setup = ProcessSetup.of_this_process()
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._watchers: list[asyncio.Task[None]] = []
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    async def start(self) -> None:
        """Every worker listening, or WorkerFailed (and none left running) when one died first."""
        self._workers = [self._spawn(index) for index in range(self._count)]  # they start side by side
        ready = await asyncio.gather(*(worker.ready() for worker in self._workers))
        failed = [worker.index for worker, ok in zip(self._workers, ready, strict=True) if not ok]
        if failed:
            await self._terminate()
            raise WorkerFailed(f"router worker(s) {failed} failed to start; see their log lines above")
        log.info("workers ready", extra={"workers": self._count, "pids": self.pids,
                                         "private_dir": str(self._private_dir) if self._private_dir else None})
        self._watchers = [asyncio.create_task(self._watch(index)) for index in range(self._count)]

    async def stop(self) -> None:
        await cancel(*self._watchers)
        await self._terminate()

    def _spawn(self, index: int) -> _Worker:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_child, args=(self._setup, self._target, index, theirs),
                                        name=f"agentreach-worker-{index}")
        process.start()
        theirs.close()  # the child holds it now; ours then reads EOF when the child dies
        log.info("worker started", extra={"worker": index, "pid": process.pid})
        return _Worker(index, process, ours)

    async def _watch(self, index: int) -> None:
        """Restart worker ``index`` whenever it exits, waiting longer after each quick death in a row."""
        quick_deaths = 0
        while True:
            worker = self._workers[index]
            code = await worker.exited()
            ran = time.monotonic() - worker.started_at
            quick_deaths = quick_deaths + 1 if ran < STABLE_AFTER else 0
            delay = restart_delay(quick_deaths)
            log.error("worker died unexpectedly; restarting",
                      extra={"worker": index, "pid": worker.pid, **_exit_fields(code), "ran_seconds": round(ran, 3),
                             "restart_in": delay})
            await asyncio.sleep(delay)
            worker.close()
            replacement = self._workers[index] = self._spawn(index)
            if await replacement.ready():
                self.restarts += 1
                log.warning("worker restarted", extra={"worker": index, "pid": replacement.pid})

    async def _terminate(self) -> None:
        """SIGTERM every worker, wait for each up to STOP_GRACE, SIGKILL the ones still running."""
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for worker in self._workers:
            try:
                code = await asyncio.wait_for(worker.exited(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.error("worker did not stop in time; killed", extra={"worker": worker.index, "pid": worker.pid,
                                                                        "grace_seconds": STOP_GRACE})
                worker.process.kill()
                code = await worker.exited()
            log.info("worker stopped", extra={"worker": worker.index, "pid": worker.pid, **_exit_fields(code)})
            worker.close()
        self._workers = []
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
