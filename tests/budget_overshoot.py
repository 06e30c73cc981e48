"""The budget overshoot scenarios of issue 25, shared by its test (tests/test_hardening2_budget_overshoot.py) and
its bench (bench/budget_overshoot_bench.py): routers sharing one client's budget, a metered agent spending what
each call's payload asks for, and what the calls that were answered spent in all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from conftest import registries
from recording_support import starting
from router_support import Answer, Mesh, meshes, run_load
from test_budgets_routers import budgeted, routers, spend
from test_usage_routing import MeteredAgent


class Overshoot(msgspec.Struct, kw_only=True):
    """What one scenario spent against its budget: ``spent`` sums the usage of the calls answered."""

    scenario: str
    budget: int
    spent: int
    answered: int
    refused: int
    largest_call: int
    routers: int

    @property
    def bound(self) -> int:
        """Issue 25's target: the budget plus one largest call per router."""
        return self.budget + self.routers * self.largest_call


def payload_of(tokens: int) -> dict[str, int]:
    """What the metered agent reads to spend ``tokens`` (half in, half out; an odd one in)."""
    return {"in": tokens - tokens // 2, "out": tokens // 2}


def tokens_of(answer: Answer) -> int:
    usage = answer.body["usage"]
    return int(usage["input_tokens"] + usage["output_tokens"])


def measured(scenario: str, budget: int, answers: list[Answer], routers: int) -> Overshoot:
    answered = [answer for answer in answers if answer.status == 200]
    assert {answer.status for answer in answers} <= {200, 429}, [a.body for a in answers if a.status not in (200, 429)]
    return Overshoot(scenario=scenario, budget=budget, spent=sum(map(tokens_of, answered)), answered=len(answered),
                     refused=len(answers) - len(answered), largest_call=max(map(tokens_of, answered), default=0),
                     routers=routers)


async def concurrent_burst(mesh_of: list[Mesh], key: str, *, budget: int, warmups: int = 5, calls: int = 80,
                           tokens: int = 200, context: dict[str, Any] | None = None,
                           scenario: str = "burst") -> Overshoot:
    """Each router serves ``warmups`` 1-token calls one after another (teaching it the client's calls are tiny),
    then ``calls`` calls of ``tokens`` are fired at once, spread evenly over the routers."""
    answers = [await spend(mesh, key, payload_of(1)) for mesh in mesh_of for _ in range(warmups)]
    extra = {"context": context} if context else {}
    answers += await asyncio.gather(*(spend(mesh_of[n % len(mesh_of)], key, payload_of(tokens), **extra)
                                      for n in range(calls)))
    return measured(scenario, budget, answers, len(mesh_of))


async def cold_start(mesh_of: list[Mesh], key: str, *, budget: int, workers: int = 8, tokens: int = 10,
                     context: dict[str, Any] | None = None) -> Overshoot:
    """From a client's first call: ``workers`` callers per router calling steadily (``tokens`` a call) until each
    router has refused the client 3 times."""
    answers: list[Answer] = []
    extra = {"context": context} if context else {}

    before = {id(mesh): mesh.router.decisions["budget_exhausted"] for mesh in mesh_of}

    def refused_at(mesh: Mesh) -> bool:
        return mesh.router.decisions["budget_exhausted"] - before[id(mesh)] >= 3

    def load(mesh: Mesh) -> Awaitable[list[tuple[float, Answer]]]:
        async def one() -> Answer:
            answer = await spend(mesh, key, payload_of(tokens), **extra)
            answers.append(answer)
            return answer
        return run_load(one, until=lambda: refused_at(mesh), concurrency=workers, limit=60)

    await asyncio.gather(*(load(mesh) for mesh in mesh_of))
    return measured("cold start", budget, answers, len(mesh_of))


@asynccontextmanager
async def budget_mesh(data: Path, count: int = 2) -> AsyncIterator[list[Mesh]]:
    """``count`` routers following one registry over HTTP, one metered agent of ``llm.chat`` (outside pytest)."""
    async with aiohttp.ClientSession() as http, registries(data) as start_registry, \
            meshes(start_registry, http) as start_mesh, starting(MeteredAgent) as metered:
        yield await routers(start_mesh, metered, count=count)


async def budgeted_client(mesh_of: list[Mesh], budget: int) -> str:
    """A new client with a ``budget``-token daily budget, known to every router: its API key."""
    return await budgeted(mesh_of, budget_tokens=budget, budget_period="day")
