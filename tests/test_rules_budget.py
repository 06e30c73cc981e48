"""Rules that match on budget use (seed 004's "budget used > 80 % and type=summary -> small model, degraded"):
the fraction a router knows (router/budgets.py ``used_fraction``, from its lease of a real registry's
account), and calls through a real registry, router and metered agents on loopback routed by it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from agent_reach.usage import Usage

from mesh.policy import Policy, Rule
from mesh.records import encode_value
from router.budgets import Budgets, Ticket
from router.candidate import Candidate
from router.rules import CallerFacts, decide, ordered
from router_support import Mesh
from test_budgets_period import registry, spender  # noqa: F401 (a fixture)
from test_budgets_routers import metered  # noqa: F401 (a fixture)

SUMMARY = {"type": "summary"}
# Seed 004's row 40, and a row after it sending every other call to the large model.
RULES = [{"id": "r40", "priority": 40, "match": {"context": SUMMARY, "budget_used_above": 0.8},
          "target": {"version": "^1"}, "action": "degrade"},
         {"id": "r50", "priority": 50, "target": {"version": "^2"}}]
TEN_TOKENS = {"in": 4, "out": 6}


async def spend(budgets: Budgets, client_id: str, usage: Usage) -> None:
    admitted = await budgets.admit(client_id, {})
    assert isinstance(admitted, Ticket)
    budgets.settle(admitted, usage)


async def test_the_fraction_counts_what_other_routers_hold_and_what_this_one_spent(registry):  # noqa: F811
    registry, clock = registry
    client_id, here = await spender(registry, clock, budget_tokens=1000, budget_period="day")
    there = Budgets("r-2", registry.state.auth.clients.get, wall_clock=clock)
    there.lease_budget = registry.budgets.lease
    assert here.used_fraction(client_id) is None  # no lease yet: nothing known, no budget rule matches

    for _ in range(3):
        await spend(there, client_id, Usage(input_tokens=4, output_tokens=6))
    await spend(here, client_id, Usage(input_tokens=4, output_tokens=6))
    # r-2 holds a 50-token lease (30 of it spent): as far as r-1 can tell, that much is gone; plus its own 10.
    assert here.used_fraction(client_id) == (50 + 10) / 1000
    await spend(here, client_id, Usage(input_tokens=40, output_tokens=0))
    assert here.used_fraction(client_id) == (50 + 50) / 1000

    clock.now += 86_400  # the period ended: nothing of the new one is used yet
    assert here.used_fraction(client_id) == 0.0


async def test_the_fraction_is_the_larger_of_tokens_and_cost_and_none_without_a_budget(registry):  # noqa: F811
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=1000, budget_cost=1.0, budget_period="day")
    free, _ = await spender(registry, clock)
    await spend(budgets, client_id, Usage(input_tokens=4, output_tokens=6, cost=0.25))
    assert budgets.used_fraction(client_id) == pytest.approx(0.25)  # the account sums cost in floats
    await spend(budgets, free, Usage(input_tokens=4, output_tokens=6))
    assert budgets.used_fraction(free) is None


def test_a_budget_rule_matches_above_its_fraction_only_and_says_by_how_much():
    table = ordered([msgspec.convert(RULES[0], Rule)]).rules
    pools = {"llm.summarize": [Candidate(agent_id="small", endpoint="http://127.0.0.1:9/call", protocol="rest",
                                         state="healthy", version="1.0.0")]}

    def rule_for(used: float | None, context: dict[str, Any] = SUMMARY) -> str | None:
        decision = decide(table, "llm.summarize", context, None, CallerFacts(client_id="c", budget_used=used),
                          lambda name: pools.get(name, []))
        return decision.reason if decision.rule else None

    assert rule_for(0.81) == "rule r40 (priority 40) matched context.type='summary' and budget used 0.81 > 0.8"
    assert [rule_for(used) for used in (None, 0.0, 0.5, 0.8)] == [None] * 4
    assert rule_for(0.95, {"type": "chat"}) is None
    assert ordered(table).uses_budget and not ordered([]).uses_budget
    reasoned = ordered([msgspec.convert({**RULES[0], "reason": "save the budget"}, Rule)])
    assert decide(reasoned.rules, "llm.summarize", SUMMARY, None, CallerFacts(budget_used=0.9),
                  lambda name: pools.get(name, [])).reason == "save the budget (budget used 0.90 > 0.8)"


def test_a_rule_without_the_condition_is_stored_as_before():
    plain = msgspec.convert({"rules": [RULES[1]]}, Policy)
    assert b"budget_used_above" not in encode_value(plain)
    assert b"budget_used_above" in encode_value(msgspec.convert({"rules": [RULES[0]]}, Policy))


async def summarize_mesh(start_mesh: Any, metered: Any) -> Mesh:  # noqa: F811
    """A router with a small (1.x) and a large (2.x) model of llm.summarize, ruled by RULES."""
    mesh = await start_mesh(follow="http", auth=True)  # leases over HTTP, as `agentreach router` asks for them
    await mesh.add(await metered("small"), "llm.summarize", version="1.0.0")
    await mesh.add(await metered("large"), "llm.summarize", version="2.0.0")
    await mesh.put_policy("llm.summarize", {"rules": RULES})
    return mesh


async def test_a_client_past_80_percent_of_its_budget_gets_the_small_model_degraded(start_mesh, metered):  # noqa: F811
    mesh = await summarize_mesh(start_mesh, metered)
    key = {"X-API-Key": (await mesh.new_client(["llm.*"], budget_tokens=200, budget_period="day"))["api_key"]}
    answers = [await mesh.call("llm.summarize", TEN_TOKENS, headers=key, context=SUMMARY) for _ in range(21)]

    # Call n is decided knowing the n-1 calls before it: 10 tokens each of 200. Call 18 is the first past 80 %.
    routes = [(a.route.get("rule"), a.route.get("instance"), a.route.get("degraded", False)) for a in answers[:20]]
    assert routes == [("r50", "large", False)] * 17 + [("r40", "small", True)] * 3, routes
    assert answers[17].route["reason"] == \
        "rule r40 (priority 40) matched context.type='summary' and budget used 0.85 > 0.8"
    assert answers[19].route["reason"].endswith("budget used 0.95 > 0.8")
    assert answers[20].status == 429 and answers[20].body["error_code"] == "BUDGET_EXHAUSTED"
    stats = await mesh.get("/rules/stats?capability=llm.summarize")
    assert {(hit["rule"], hit["calls"]) for hit in stats["hits"]} == {("r40", 3), ("r50", 17)}


async def test_below_the_fraction_without_the_context_or_without_a_budget_the_rule_never_matches(
        start_mesh, metered):  # noqa: F811
    mesh = await summarize_mesh(start_mesh, metered)
    budgeted = {"X-API-Key": (await mesh.new_client(["llm.*"], budget_tokens=100, budget_period="day"))["api_key"]}
    free = {"X-API-Key": (await mesh.new_client(["llm.*"], name="free"))["api_key"]}
    for _ in range(8):
        assert (await mesh.call("llm.summarize", TEN_TOKENS, headers=budgeted, context={"type": "chat"})).status == 200
    one_token = {"in": 1, "out": 0}
    # 80 % used is not past 80 %; at 81 % a chat call is not a summary; at 82 % a summary takes the small model.
    at_80, chat, summary = [await mesh.call("llm.summarize", one_token, headers=budgeted, context=context)
                            for context in (SUMMARY, {"type": "chat"}, SUMMARY)]
    assert [a.route.get("rule") for a in (at_80, chat, summary)] == ["r50", "r50", "r40"]
    assert summary.route["reason"].endswith("budget used 0.82 > 0.8")
    unbudgeted = [await mesh.call("llm.summarize", TEN_TOKENS, headers=free, context=SUMMARY) for _ in range(12)]
    assert {(a.status, a.route["rule"]) for a in unbudgeted} == {(200, "r50")}


@pytest.mark.parametrize("above", [0, -0.5, 1.01, "0.9", True, None])
async def test_a_bad_fraction_is_refused_naming_the_field_and_changes_nothing(start_mesh, above):
    mesh = await start_mesh(auth=True)
    before = await mesh.put_policy("llm.summarize", {"rules": RULES})
    bad = [{**RULES[0], "match": {"context": SUMMARY, "budget_used_above": above}}, RULES[1]]
    async with mesh.http.put(f"{mesh.registry.url}/policies/llm.summarize", json={"rules": bad},
                             headers=mesh.admin) as answer:
        assert answer.status == 400
        body = await answer.json()
    assert body["field"] == "rules[0].match.budget_used_above" and body["error"] and body["message"], body
    async with mesh.http.get(f"{mesh.registry.url}/policies/llm.summarize", headers=mesh.admin) as answer:
        assert msgspec.convert(await answer.json(), Policy) == before
    assert (await mesh.put_policy("llm.summarize", {"rules": [{**RULES[0], "match": {"budget_used_above": 1}}]}
                                  )).rules[0].match.budget_used_above == 1.0
