"""A client's budget across its period's end: a router's budgets spending from a real registry's account
(its WAL in a temporary dir, in process), both on one wall clock the test moves, so the reset is reached
without waiting an hour."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_reach.atp import ErrorCode
from agent_reach.usage import Usage

from auth.records import ClientCreate
from registry.lifecycle import LifecycleConfig
from registry.service import Registry
from registry.store import WalStore
from router.auth import Refusal
from router.budgets import Budgets, Ticket

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


async def test_a_spent_hourly_budget_is_refused_until_the_hour_ends_then_spent_again(registry):
    registry, clock = registry
    client = await registry.access.create_client(ClientCreate(name="app", trust_level="internal", grants=["llm.*"],
                                                              budget_tokens=30, budget_period="hour"))
    budgets = Budgets("r-1", registry.state.auth.clients.get, wall_clock=clock)
    budgets.lease_budget = registry.budgets.lease

    async def call() -> Ticket | Refusal:
        admitted = await budgets.admit(client.client_id, {})
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
    account = registry.budgets.account(client.client_id)
    assert account.period_start == datetime(2026, 12, 1, 11, tzinfo=UTC).timestamp()
    assert account.committed_tokens == 30
