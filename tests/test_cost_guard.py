"""The call path's cost guard: Python bytecodes executed by N routed calls in process (auth on, audit on)
against the same N calls through the bare forwarder, to a real echo agent in a process of its own. The count
is deterministic where a timing is not (two passes agree to about 0.02 %), so it can fail CI: a change that
raises the ratio past the allowance in tests/cost_guard.json fails with the figure, and raising the held
ratio is an explicit commit of that file. A planted regression shows the guard fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from agent_reach.atp import RequestFrame

from doc_support import ROOT, wait_up
from router.timeouts import ResolvedTimeouts
from router.tracecontext import open_span
from sdk_support import free_port

HELD = Path(__file__).with_name("cost_guard.json")
CALLS = 100
TIMEOUTS = ResolvedTimeouts(connect_s=5.0, first_byte_s=5.0, total_s=5.0)


class Opcodes:
    """Counts the bytecodes the thread executes while installed (sys.settrace with opcode events)."""

    def __init__(self) -> None:
        self.count = 0

    def _global(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.count += 1
        return self._local


async def opcodes_of(call: Callable[[int], Awaitable[Any]], calls: int = CALLS) -> int:
    counter = Opcodes()
    sys.settrace(counter._global)
    try:
        for n in range(calls):
            await call(n)
    finally:
        sys.settrace(None)
    return counter.count


def verdict(measured: float, held: dict[str, float]) -> str | None:
    """None while ``measured`` is within the allowance over the held ratio; else what to say."""
    limit = held["ratio"] * (1 + held["allowance"])
    if measured <= limit:
        return None
    return (f"the routed call path costs {measured:.4f}x the bare forwarder's bytecodes, over the held "
            f"{held['ratio']:.4f}x + {held['allowance']:.0%} ({limit:.4f}x): make the change cheaper, or raise "
            f"the ratio in {HELD.name} in a commit that says why")


@pytest.fixture
async def echo_agent(http):
    """bench/router_bench.py's aiohttp echo, in its own process: its server's bytecodes are not counted."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "bench/router_bench.py", "echo", "--port", str(port)], cwd=ROOT,
                               stdout=subprocess.DEVNULL)
    try:
        await wait_up(http, f"http://127.0.0.1:{port}/healthz", process)
        yield f"http://127.0.0.1:{port}/echo"
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
async def ratio_of(start_mesh, echo_agent, tmp_path):
    """Measures the ratio (after a warm-up pass of each, so first-call caches are not counted)."""
    mesh = await start_mesh(auth=True, router_settings={"audit_path": tmp_path / "audit.db"})
    await mesh.register("echo-1", [{"name": "echo", "endpoint": echo_agent, "protocol": "rest"}])
    await mesh.ready("echo-1")
    client = await mesh.new_client(["echo"])
    caller = mesh.router_server.auth.authenticate({"X-API-Key": client["api_key"]})
    router = mesh.router

    async def routed(n: int) -> None:
        result = await router.call(RequestFrame(capability="echo", payload={"n": n}), caller)
        assert result.http_status == 200, result.frame

    async def bare(n: int) -> None:
        answer = await router.forwarder.send(echo_agent, "rest", RequestFrame(capability="echo", payload={"n": n}),
                                             TIMEOUTS, span=open_span({"trace_id": "t"}, None))
        assert answer.error_code is None, answer.message

    async def measure() -> float:
        await opcodes_of(routed, 10)
        await opcodes_of(bare, 10)
        return await opcodes_of(routed) / await opcodes_of(bare)

    return mesh, measure


async def test_the_call_path_costs_no_more_than_the_held_ratio(ratio_of):
    _, measure = ratio_of
    measured = await measure()
    failure = verdict(measured, json.loads(HELD.read_text()))
    assert failure is None, failure


async def test_a_planted_regression_fails_the_guard(ratio_of, monkeypatch):
    mesh, measure = ratio_of
    held = {"ratio": await measure(), "allowance": json.loads(HELD.read_text())["allowance"]}
    account = mesh.router.accounting.account

    def slower(*args: Any) -> None:
        sum(n * n for n in range(300))  # some Python work a call, as a careless feature might add
        account(*args)

    monkeypatch.setattr(mesh.router.accounting, "account", slower)
    failure = verdict(await measure(), held)
    assert failure is not None and "raise the ratio in cost_guard.json" in failure
