"""Client budgets and session caps at the router, end to end: a real registry, real routers following it
over HTTP (two sharing one client's budget under concurrent load), a real agent on 127.0.0.1 reporting
usage. The overshoot bound tested is the one documented (router/budgets.py, docs/atp.md "Worst-case overshoot")."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conftest import call, wait_for
from recording_support import starting
from router.core import RouterSettings
from router_support import Answer, Mesh, run_load
from test_usage_routing import MeteredAgent

CALL_TOKENS = {"in": 4, "out": 6}
TOKENS_PER_CALL = 10
WORKERS = 6


@pytest.fixture
async def metered() -> AsyncIterator[Callable[..., Awaitable[MeteredAgent]]]:
    async with starting(MeteredAgent) as start:
        yield start


async def routers(start_mesh, metered, count: int = 2, routing: RouterSettings = RouterSettings(),
                  **prices: Any) -> list[Mesh]:
    """``count`` routers following one registry over HTTP, each seeing one metered agent healthy."""
    first = await start_mesh(follow="http", auth=True, routing=routing)
    meshes = [first, *[await start_mesh(follow="http", auth=True, registry=first.registry, routing=routing)
                       for _ in range(count - 1)]]
    agent = await metered("llm-1")
    await first.add(agent, "llm.chat", **prices)
    for mesh in meshes[1:]:
        await mesh.until_state("llm-1")
    return meshes


async def budgeted(meshes: list[Mesh], **budget: Any) -> str:
    """A client of ``llm.*`` with ``budget``, known to every router; its API key."""
    secrets = await meshes[0].new_client(["llm.*"], **budget)
    for mesh in meshes[1:]:
        await wait_for(lambda mesh=mesh: secrets["client_id"] in mesh.router.mirror.auth.clients, timeout=5,
                       what="every router to learn the client")
    return str(secrets["api_key"])


def spend(mesh: Mesh, key: str, payload: dict[str, Any] = CALL_TOKENS, **frame: Any) -> Awaitable[Answer]:
    return mesh.call("llm.chat", payload, headers={"X-API-Key": key}, **frame)


async def until_refused(meshes: list[Mesh], key: str) -> dict[int, list[Answer]]:
    """Every router called by WORKERS callers at once until each refused the client at least 3 times; the
    answers by router (``id(mesh)``), in order."""
    answers: dict[int, list[Answer]] = {id(mesh): [] for mesh in meshes}

    def refused() -> int:
        return min(sum(answer.status == 429 for answer in kept) for kept in answers.values())

    def load(mesh: Mesh) -> Awaitable[list[tuple[float, Answer]]]:
        async def one() -> Answer:
            answer = await spend(mesh, key)
            answers[id(mesh)].append(answer)
            return answer
        return run_load(one, until=lambda: refused() >= 3, concurrency=WORKERS, limit=60)

    await asyncio.gather(*(load(mesh) for mesh in meshes))
    assert {answer.status for kept in answers.values() for answer in kept} == {200, 429}
    return answers


def tokens_used(answers: dict[int, list[Answer]]) -> int:
    return sum(answer.body["usage"]["input_tokens"] + answer.body["usage"]["output_tokens"]
               for kept in answers.values() for answer in kept if answer.status == 200)


def midnight_after(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)


async def test_two_routers_under_load_never_overshoot_a_daily_budget_past_the_bound(start_mesh, metered):
    meshes = await routers(start_mesh, metered)
    budget = 1000
    key = await budgeted(meshes, budget_tokens=budget, budget_period="day")
    before = time.time()
    answers = await until_refused(meshes, key)
    after = time.time()

    used = tokens_used(answers)
    # The documented bound: one largest call per router (its calls declare no bound: one at a time at a router).
    bound = len(meshes) * TOKENS_PER_CALL
    assert budget - len(meshes) * TOKENS_PER_CALL <= used <= budget + bound, used
    assert all(mesh.router.decisions["budget_exhausted"] >= 3 for mesh in meshes)
    assert all(answer.status == 200 for mesh in meshes for answer in answers[id(mesh)][:1]), "both routers served"

    refusal = next(a for a in answers[id(meshes[1])] if a.status == 429)
    assert refusal.body["error_code"] == "BUDGET_EXHAUSTED" and refusal.body["can_retry"] is True
    reset = refusal.body["reset_at"]
    assert reset in {midnight_after(before).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     midnight_after(after).strftime("%Y-%m-%dT%H:%M:%SZ")}
    reset_at = datetime.strptime(reset, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    assert math.ceil(reset_at - after) - 1 <= int(refusal.headers["Retry-After"]) <= math.ceil(reset_at - before)
    assert reset in refusal.body["error_message"]


async def test_the_registry_account_holds_what_the_routers_were_granted(start_mesh, metered, http):
    meshes = await routers(start_mesh, metered)
    key = await budgeted(meshes, budget_tokens=200, budget_period="hour")
    for mesh in meshes * 12:
        await spend(mesh, key)
    registry = meshes[0].registry
    client_id = next(iter(registry.registry.state.auth.clients))
    status, account = await call(http, "GET", f"{registry.url}/budgets/{client_id}", meshes[0].admin_key)
    assert status == 200 and account["committed_tokens"] <= 200 + 2 * TOKENS_PER_CALL
    assert set(account["routers"]) == {mesh.router.mirror.router_id for mesh in meshes}
    assert sum(mesh.router.decisions["budget_exhausted"] for mesh in meshes) >= 3


async def test_a_cost_budget_admits_calls_while_their_cost_fits(start_mesh, metered):
    [mesh] = await routers(start_mesh, metered, count=1, cost_per_call=1.0)
    key = await budgeted([mesh], budget_cost=5.0, budget_period="month")
    answers = [await spend(mesh, key) for _ in range(8)]
    assert [a.status for a in answers] == [200] * 5 + [429] * 3
    assert sum(a.body["usage"]["cost"] for a in answers[:5]) == 5.0
    assert answers[5].body["reset_at"].endswith("-01T00:00:00Z")


async def test_a_raised_budget_is_spent_at_once(start_mesh, metered, http, router_logs):
    [mesh] = await routers(start_mesh, metered, count=1)
    secrets = await mesh.new_client(["llm.*"], budget_tokens=30, budget_period="day")
    key = secrets["api_key"]
    assert [(await spend(mesh, key)).status for _ in range(4)] == [200, 200, 200, 429]
    # A client may keep calling once its budget is spent: each refusal is logged, but not as a warning.
    [refused] = [line for line in router_logs.named("call refused") if line["error_code"] == "BUDGET_EXHAUSTED"]
    assert refused["level"] == "info" and refused["client_id"] == secrets["client_id"]
    status, _ = await call(http, "PUT", f"{mesh.registry.url}/clients/{secrets['client_id']}/budget", mesh.admin_key,
                           {"budget_tokens": 50, "budget_period": "day"})
    assert status == 200
    await wait_for(lambda: mesh.router.mirror.auth.clients[secrets["client_id"]].budget_tokens == 50, timeout=5,
                   what="the router to see the raised budget")
    assert [(await spend(mesh, key)).status for _ in range(3)] == [200, 200, 429]


async def test_an_unreachable_registry_leaves_only_the_lease_held(start_mesh, metered):
    [mesh] = await routers(start_mesh, metered, count=1)
    key = await budgeted([mesh], budget_tokens=1000, budget_period="day")
    assert (await spend(mesh, key)).status == 200  # the first lease: a 5% chunk, 50 tokens
    await mesh.registry.stop()
    answers = [await spend(mesh, key) for _ in range(8)]
    statuses = [a.status for a in answers]
    # 10 tokens used of the 50 granted: 4 more calls fit, then nothing until the registry answers again.
    assert statuses == [200] * 4 + [429] * 4
    assert answers[4].body["error_code"] == "BUDGET_EXHAUSTED" and answers[4].headers["Retry-After"] == "5"
    assert "cannot be asked" in answers[4].body["error_message"]
    assert mesh.router.decisions["budget_unconfirmed"] == 4


async def test_a_session_is_capped_at_its_token_budget(start_mesh, metered):
    [mesh] = await routers(start_mesh, metered, count=1)
    key = await budgeted([mesh])
    other = await budgeted([mesh])
    session = {"session_id": "s-1", "token_budget": 25}
    assert [(await spend(mesh, key, context=session)).status for _ in range(2)] == [200, 200]
    refused = await spend(mesh, key, context=session)  # a third call (10 tokens, as the client's calls) would pass 25
    assert refused.status == 429 and refused.body["error_code"] == "BUDGET_EXHAUSTED"
    assert "20 of 25 tokens" in refused.body["error_message"] and "Retry-After" not in refused.headers
    # A nested call carries what its caller has left: it does not lower the session's own budget, nor raise it past.
    assert (await spend(mesh, key, context={"session_id": "s-1", "token_budget": 5})).status == 429
    # Another session, or the same session id of another client, is counted apart; a call naming no cap is not capped.
    assert (await spend(mesh, key, context={"session_id": "s-2", "token_budget": 25})).status == 200
    assert (await spend(mesh, other, context=session)).status == 200
    assert (await spend(mesh, key, context={"session_id": "s-1"})).status == 200
    assert mesh.router.decisions["session_budget_exhausted"] == 2


async def test_routers_report_their_spend_and_give_back_what_they_hold_when_they_stop(start_mesh, metered, http):
    meshes = await routers(start_mesh, metered, routing=RouterSettings(budget_report_seconds=0.05))
    key = await budgeted(meshes, budget_tokens=1000, budget_period="day")
    for mesh in meshes:
        for _ in range(3):
            assert (await spend(mesh, key)).status == 200
    registry = meshes[0].registry
    client_id = next(iter(registry.registry.state.auth.clients))
    ids = [mesh.router.mirror.router_id for mesh in meshes]

    async def account() -> dict[str, Any]:
        status, body = await call(http, "GET", f"{registry.url}/budgets/{client_id}", meshes[0].admin_key)
        assert status == 200
        return dict(body)

    async def reported() -> bool:
        return (await account())["spent_tokens"] == 60

    # No lease ran low (each holds a 50-token chunk, 30 spent): the spend reaches the registry all the same.
    await wait_for(reported, timeout=5, what="both routers to report 60 tokens spent")
    assert (await account())["committed_tokens"] == 100
    await meshes[0].router_server.stop()
    shares = (await account())["routers"]
    assert (shares[ids[0]]["granted_tokens"], shares[ids[0]]["spent_tokens"]) == (30, 30)
    assert (shares[ids[1]]["granted_tokens"], shares[ids[1]]["spent_tokens"]) == (50, 30)
