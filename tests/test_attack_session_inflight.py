"""Attacks on the per-session token cap with calls in flight: calls of one session sent at once, each passing the
cap before any of them ended. A real registry and router, a metered agent on 127.0.0.1 that holds its answers until
the test lets them go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from conftest import wait_for
from recording_support import Received, starting
from router_support import Answer
from test_budgets_routers import budgeted, routers, spend
from test_usage_routing import MeteredAgent


class HeldAgent(MeteredAgent):
    """Answers (with the usage asked for) only once ``answering`` is set; counts the calls that arrived."""

    def __init__(self, name: str):
        super().__init__(name)
        self.answering = asyncio.Event()
        self.arrived = 0

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        self.arrived += 1
        await self.answering.wait()
        return await super()._answer(request, received)


class HeldAgents:
    """Starts held agents (as the ``metered`` fixture test_budgets_routers.routers takes) and keeps them."""

    def __init__(self, start: Callable[..., Awaitable[HeldAgent]]):
        self._start = start
        self.started: list[HeldAgent] = []

    async def __call__(self, name: str) -> HeldAgent:
        self.started.append(await self._start(name))
        return self.started[-1]


@pytest.fixture
async def metered() -> AsyncIterator[HeldAgents]:
    async with starting(HeldAgent) as start:
        yield HeldAgents(start)


async def test_calls_of_one_session_in_flight_at_once_each_reserve_the_clients_estimate_of_its_cap(
        start_mesh, metered):
    [mesh] = await routers(start_mesh, metered, count=1)
    key = await budgeted([mesh])
    [held] = metered.started
    held.answering.set()
    # The client's calls use 10 tokens (one call of another session says so).
    assert (await spend(mesh, key, context={"session_id": "s-learn", "token_budget": 1000})).status == 200
    held.answering.clear()

    capped = {"session_id": "s-capped", "token_budget": 25}
    calls = [asyncio.create_task(spend(mesh, key, context=capped)) for _ in range(5)]

    def refused() -> int:
        return sum(call.done() and call.result().status == 429 for call in calls)
    await wait_for(lambda: held.arrived - 1 + refused() == 5, timeout=10, what="every call to reach the agent or "
                   "be refused")
    held.answering.set()
    answers: list[Answer] = await asyncio.gather(*calls)
    # Two calls reserve 10 tokens each of the 25; a third would pass the cap by what it would reserve.
    assert sorted(answer.status for answer in answers) == [200, 200, 429, 429, 429]
    assert (await spend(mesh, key, context=capped)).status == 429  # 20 used, 10 more would pass 25


async def test_a_call_cancelled_while_its_client_lease_is_asked_for_gives_back_its_session_reservation(
        start_mesh, metered):
    [mesh] = await routers(start_mesh, metered, count=1)
    secrets = await mesh.new_client(["llm.*"], budget_tokens=1000, budget_period="day")
    key, client_id = secrets["api_key"], secrets["client_id"]
    [held] = metered.started
    held.answering.set()
    for _ in range(5):  # the 50-token lease spent: the next call asks the registry
        assert (await spend(mesh, key)).status == 200
    budgets = mesh.router.budgets
    asking = budgets.lease_budget
    assert asking is not None
    asked, registry_answers = asyncio.Event(), asyncio.Event()

    async def slow_registry(client_id, request):
        asked.set()
        await registry_answers.wait()
        return await asking(client_id, request)
    budgets.lease_budget = slow_registry

    capped = {"session_id": "s-capped", "token_budget": 25}
    gone = asyncio.create_task(budgets.admit(client_id, capped))
    await asked.wait()
    gone.cancel()  # the caller went away while the registry was asked
    registry_answers.set()
    # Its 10-token reservation went with it: two calls of 10 fit in 25.
    assert [(await spend(mesh, key, context=capped)).status for _ in range(3)] == [200, 200, 429]
