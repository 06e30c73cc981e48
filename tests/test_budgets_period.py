"""A client's budget across its period's end: a router's budgets spending from a real registry's account
(its WAL in a temporary dir, in process), both on one wall clock the test moves, so the reset is reached
without waiting an hour."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agent_reach.atp import ErrorCode
from agent_reach.usage import Usage

from auth.records import ClientCreate
from mesh.budgets import LeaseRequest, RouterShare
from registry.lifecycle import LifecycleConfig
from registry.service import Registry
from registry.store import WalStore
from router.auth import Refusal
from router.budgets import MAX_FRUITLESS_ASKS, Budgets, Ticket

CALL = Usage(input_tokens=4, output_tokens=6)


class Clock:
    def __init__(self, moment: datetime):
        self.now = moment.timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[tuple[Registry, Clock]]:
    clock = Clock(datetime(2026, 12, 1, 10, 59, 0, tzinfo=UTC))
    store = WalStore(tmp_path)
    store.open()
    registry = Registry(store, LifecycleConfig(), wall_clock=clock)
    yield registry, clock
    registry.close()
    await store.close()


async def spender(registry: Registry, clock: Clock, **budget: Any) -> tuple[str, Budgets]:
    """A client with ``budget`` and a router's budgets on the test's clock, leasing from ``registry`` in process."""
    client = await registry.access.create_client(ClientCreate(name="app", trust_level="internal", grants=["llm.*"],
                                                              **budget))
    budgets = Budgets("r-1", registry.state.auth.clients.get, wall_clock=clock)
    budgets.lease_budget = registry.budgets.lease
    return client.client_id, budgets


async def test_a_spent_hourly_budget_is_refused_until_the_hour_ends_then_spent_again(registry):
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=30, budget_period="hour")

    async def call() -> Ticket | Refusal:
        admitted = await budgets.admit(client_id, {})
        if isinstance(admitted, Ticket):
            budgets.settle(admitted, CALL)
        return admitted

    first_hour = [await call() for _ in range(4)]
    assert [isinstance(answer, Ticket) for answer in first_hour] == [True, True, True, False]
    refusal = first_hour[3]
    assert isinstance(refusal, Refusal) and refusal.code is ErrorCode.BUDGET_EXHAUSTED
    assert (refusal.reset_at, refusal.retry_after) == ("2026-12-01T11:00:00Z", 60)
    clock.now += 59
    assert isinstance(await call(), Refusal)

    clock.now += 1
    next_hour = [await call() for _ in range(4)]
    assert [isinstance(answer, Ticket) for answer in next_hour] == [True, True, True, False]
    assert next_hour[3].reset_at == "2026-12-01T12:00:00Z"
    account = registry.budgets.account(client_id)
    assert account.period_start == datetime(2026, 12, 1, 11, tzinfo=UTC).timestamp()
    assert account.committed_tokens == 30


async def test_a_cost_budget_spent_in_float_steps_ends_in_a_refusal(registry):
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_cost=0.3, budget_period="day")
    asks = []

    async def lease(client_id, request):
        asks.append(request)
        return await registry.budgets.lease(client_id, request)

    budgets.lease_budget = lease
    answers = []
    for _ in range(6):
        admitted = await budgets.admit(client_id, {})
        answers.append(admitted)
        if isinstance(admitted, Ticket):
            budgets.settle(admitted, Usage(cost=0.1))
    # 0.1 + 0.1 + 0.1 passes 0.3 by a rounding error, which refused the third call; nothing loops asking.
    assert [isinstance(answer, Ticket) for answer in answers] == [True, True, True, False, False, False]
    assert len(asks) < 10
    assert registry.budgets.account(client_id).committed_cost <= 0.3


async def test_a_registry_granting_nothing_yet_never_dry_is_asked_a_bounded_number_of_times(registry):
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=1000, budget_period="day")
    asks = []

    async def stuck(client_id, request):
        """A registry that answers every ask with the same empty share but says tokens are left."""
        asks.append(request)
        grant = await registry.budgets.lease(client_id, LeaseRequest(router_id="someone-else"))
        return msgspec.structs.replace(grant, share=RouterShare())

    budgets.lease_budget = stuck
    async with asyncio.timeout(5):
        refused = await budgets.admit(client_id, {})
    assert isinstance(refused, Refusal) and refused.code is ErrorCode.BUDGET_EXHAUSTED and refused.retry_after == 5
    assert len(asks) == MAX_FRUITLESS_ASKS + 1
    assert isinstance(await budgets.admit(client_id, {}), Refusal) and len(asks) == MAX_FRUITLESS_ASKS + 1


async def test_callers_racing_for_one_lease_are_all_admitted_while_the_budget_covers_them(registry):
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=2000, budget_period="day")
    first = await budgets.admit(client_id, {})
    assert isinstance(first, Ticket)
    budgets.settle(first, CALL)
    # Calls declaring their 10 tokens run at once (undeclared ones would go one at a time); a lease is a 100-token
    # chunk, so the racers need many asks.
    racing = await asyncio.gather(*(budgets.admit(client_id, {"max_tokens": 10}) for _ in range(150)))
    assert all(isinstance(answer, Ticket) for answer in racing)
    assert isinstance(await budgets.admit(client_id, {"max_tokens": 10}), Ticket)
    account = registry.budgets.account(client_id)
    assert 10 + 151 * 10 <= account.committed_tokens <= 2000  # spent, and reserved by the calls in flight
