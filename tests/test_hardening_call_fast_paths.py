"""The common call skips what it does not need (issue 18: the routing features' per-call cost won back): no
budget admission without a budget or a session cap, no token bucket for an instance without max_qps, no
pricing of an answer without usage from an instance without prices, a success judged once. Each fast path
is pinned here against a real mesh, beside the call that still takes the slow path."""

from __future__ import annotations

from typing import Any

import router.core
import router.outcome
from router_support import Mesh


async def test_a_call_without_budget_or_session_cap_is_admitted_without_the_budgets(mesh: Mesh, start_agent,
                                                                                 monkeypatch):
    await mesh.add(await start_agent("a"))
    asked: list[dict[str, Any]] = []
    admit = mesh.router.budgets.admit

    async def counted(client_id: str | None, context: dict[str, Any], *wait: float) -> Any:
        asked.append(context)
        return await admit(client_id, context, *wait)
    monkeypatch.setattr(mesh.router.budgets, "admit", counted)
    assert (await mesh.call("echo", {"n": 1}, context={"session_id": "s-1"})).status == 200
    assert asked == []
    capped = await mesh.call("echo", {"n": 2}, context={"session_id": "s-1", "token_budget": 1000})
    assert capped.status == 200 and len(asked) == 1


async def test_an_instance_without_max_qps_has_no_bucket_asked_and_one_with_it_does(mesh: Mesh, start_agent,
                                                                                    monkeypatch):
    await mesh.add(await start_agent("free"))
    await mesh.add(await start_agent("limited"), "limited", metadata={"max_qps": 1000})
    asked: list[str] = []
    bucket = mesh.router.book.bucket

    def counted(agent_id: str, max_qps: float) -> Any:
        asked.append(agent_id)
        return bucket(agent_id, max_qps)
    monkeypatch.setattr(mesh.router.book, "bucket", counted)
    assert (await mesh.call("echo", {})).status == 200
    assert asked == []
    assert (await mesh.call("limited", {})).status == 200
    assert set(asked) == {"limited"}


async def test_an_answer_without_usage_from_an_unpriced_instance_is_not_priced(mesh: Mesh, start_agent,
                                                                               monkeypatch):
    await mesh.add(await start_agent("plain"))
    await mesh.add(await start_agent("priced"), "priced", cost_per_call=0.5)
    priced: list[Any] = []
    price = router.core.priced

    def counted(capability: Any, usage: Any) -> Any:
        priced.append(capability)
        return price(capability, usage)
    monkeypatch.setattr(router.core, "priced", counted)
    plain = await mesh.call("echo", {})
    assert plain.status == 200 and plain.body.get("usage") is None and priced == []
    paid = await mesh.call("priced", {})
    assert paid.status == 200 and paid.body["usage"]["cost"] == 0.5 and len(priced) == 1


async def test_a_success_is_judged_once_without_the_reading_table(mesh: Mesh, start_agent, monkeypatch):
    """The outcome observer judges an answer and hands its verdict to the measurements; a success needs
    no reading at all (the failure still does, and is counted)."""
    agent = await start_agent("a")
    await mesh.add(agent)
    readings: list[Any] = []
    read = router.outcome.read

    def counted(answer: Any) -> Any:
        readings.append(answer)
        return read(answer)
    monkeypatch.setattr(router.outcome, "read", counted)
    assert (await mesh.call("echo", {})).status == 200
    assert readings == []
    measured = mesh.router.measurements.get("echo", "a")
    assert measured is not None and (measured.samples, measured.errors) == (1, 0)
    agent.status = 500
    assert (await mesh.call("echo", {})).status != 200
    assert readings and (measured.samples, measured.errors) == (2, 1)
