"""Issue 25 item 3: a budget label acts under every policy, never ignored (docs/atp.md "Budget labels").

Economy narrows the pool to the cheapest instances meeting their SLA (prices within ECONOMY_PRICE_BAND of the
cheapest count as one price), then the policy chooses among them; premium and no label leave the pool whole.
End to end: a real registry and router, real agents on loopback, counted per instance over N calls; then the
filter itself, as the pure function plan_route applies.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from agent_support import Agent
from router.candidate import Candidate
from router.forward import AgentAnswer
from router.measurements import Measurements
from router.selection import ECONOMY_PRICE_BAND, RoutePlan, plan_route
from router_support import Answer, Mesh

CALLS = 40
# Two cheap instances whose prices differ by less than the band (one price, not split), then two dearer ones.
PRICES = {"cheap-a": 0.001, "cheap-b": 0.001 * (1 + ECONOMY_PRICE_BAND / 2), "mid": 0.01, "dear": 0.1}
CHEAP = {"cheap-a", "cheap-b"}


async def priced(mesh: Mesh, start_agent, policy: str, prices: dict[str, float | None],
                 sla_ms: dict[str, int] | None = None) -> dict[str, Agent]:
    agents = {name: await start_agent(name) for name in prices}
    for name, agent in agents.items():
        price = prices[name]
        await mesh.add(agent, "echo", healthy=False, timeout_sla_ms=(sla_ms or {}).get(name, 5000),
                       **({"cost_per_call": price} if price is not None else {}))
    await mesh.ready(*agents)
    await mesh.put_policy("echo", {"policy": policy})
    mesh.router._rng.seed(25)
    return agents


async def calls(mesh: Mesh, count: int, budget: str | None) -> list[Answer]:
    """``count`` calls, each of its own session (the hash policy spreads sessions), all with the label."""
    context = {"budget": budget} if budget is not None else {}
    return [await mesh.call(payload=n, context={**context, "session_id": f"s{n}"}) for n in range(count)]


def served(answers: list[Answer]) -> Counter[str]:
    assert {answer.status for answer in answers} == {200}, [answer.body for answer in answers]
    return Counter(answer.route["instance"] for answer in answers)


@pytest.mark.parametrize("policy", ["least_load", "hash", "affinity", "scored"])
async def test_economy_reaches_only_the_cheapest_under_every_policy(mesh: Mesh, start_agent, policy):
    await priced(mesh, start_agent, policy, PRICES)
    economy = await calls(mesh, CALLS, "economy")
    reached = served(economy)
    assert set(reached) <= CHEAP, reached
    if policy != "scored":  # the scored policy may keep to one of two alike; the others spread over both
        assert set(reached) == CHEAP, reached
    # The route says what the label did: which price it kept, how many instances of how many.
    assert {str(answer.route["budget"]) for answer in economy} == {str(
        {"label": "economy", "reference_price": PRICES["cheap-a"], "instances": 2, "of": 4})}


@pytest.mark.parametrize("policy", ["least_load", "hash"])
@pytest.mark.parametrize("budget", ["premium", "standard", None])
async def test_premium_and_no_label_spread_as_the_policy_does(mesh: Mesh, start_agent, policy, budget):
    await priced(mesh, start_agent, policy, PRICES)
    answers = await calls(mesh, CALLS, budget)
    assert set(served(answers)) == set(PRICES)
    routes = {str(answer.route.get("budget")) for answer in answers}
    assert routes == ({str({"label": "premium", "reference_price": None, "instances": 4, "of": 4})}
                      if budget == "premium" else {"None"})


async def test_economy_fails_over_to_the_next_cheapest_when_the_cheapest_is_down(mesh: Mesh, start_agent):
    agents = await priced(mesh, start_agent, "least_load", {"cheap": 0.001, "mid": 0.01, "dear": 0.1})
    await agents["cheap"].stop()
    answers = await calls(mesh, 10, "economy")
    assert served(answers) == {"mid": 10}
    assert agents["dear"].calls == 0
    # The first call found the cheapest refusing: it went on to the next cheapest, degraded.
    assert answers[0].route["attempts"] == 2 and answers[0].route["reason"] == "failover"
    trace = await mesh.get(f"/traces/{answers[0].body['request_id']}")
    assert trace["call"]["plan"] == ["cheap", "mid", "dear"]
    assert [attempt["instance"] for attempt in trace["call"]["attempts"]] == ["cheap", "mid"]
    assert trace["call"]["budget"] == {"label": "economy", "reference_price": 0.001, "instances": 1, "of": 3}
    # Once ejected, the cheapest is out of the pool: the next cheapest is the band.
    assert answers[-1].route["budget"] == {"label": "economy", "reference_price": 0.01, "instances": 1, "of": 2}


async def test_economy_leaves_an_instance_missing_its_sla_under_least_load(mesh: Mesh, start_agent):
    agents = await priced(mesh, start_agent, "least_load", {"cheap": 0.001, "mid": 0.01, "dear": 0.1},
                          sla_ms={"cheap": 40})
    agents["cheap"].first_byte_delay = 0.08  # past its 40 ms SLA: every call to it times out
    answers = [await mesh.call(payload=n, context={"budget": "economy"}) for n in range(6)]
    assert answers[0].route["instance"] == "cheap" and answers[0].status == 504
    assert served(answers[1:]) == {"mid": 5} and agents["dear"].calls == 0


async def test_without_any_price_economy_keeps_every_instance_and_says_so(mesh: Mesh, start_agent):
    await priced(mesh, start_agent, "least_load", {"free-a": None, "free-b": None})
    answers = await calls(mesh, CALLS, "economy")
    assert set(served(answers)) == {"free-a", "free-b"}
    assert answers[0].route["budget"] == {"label": "economy", "reference_price": None, "instances": 2, "of": 2}


@pytest.mark.parametrize("label", ["cheap", "Economy", 5, True, ["economy"], {"label": "economy"}, ""])
async def test_a_label_the_router_does_not_know_is_refused_under_the_default_policy(mesh: Mesh, start_agent,
                                                                                    label):
    agent = await start_agent("echo-1")
    await mesh.add(agent, "echo")
    answer = await mesh.call(context={"budget": label})
    assert answer.status == 400 and answer.body["error_code"] == "INVALID_FRAME"
    assert answer.body["field"] == "context.budget" and agent.calls == 0


def candidate(agent_id: str, cost: float | None, *, inflight: int = 0, latency_ms: float | None = None) -> Candidate:
    """An instance at ``cost``; with ``latency_ms``, measured at that latency against a 100 ms SLA."""
    measurements = Measurements()
    if latency_ms is not None:
        measurements.observe("echo", agent_id, AgentAnswer(result={}, elapsed_ms=latency_ms))
    return Candidate(agent_id=agent_id, endpoint="http://127.0.0.1:9/call", protocol="rest", state="healthy",
                     cost=cost, inflight=inflight, measured=measurements.get("echo", agent_id), sla_ms=100)


def plan(pool: list[Candidate], budget: str | None, *, sticky: str | None = None) -> RoutePlan:
    planned = plan_route(pool, policy_name="least_load", hash_key="k", routing_hint=None, sticky_agent=sticky,
                         rng=random.Random(1), budget=budget)
    assert isinstance(planned, RoutePlan)
    return planned


def ids(planned: RoutePlan) -> list[str]:
    return [each.agent_id for each in planned.order]


def test_the_band_keeps_near_equal_prices_and_the_rest_fail_over_cheapest_first():
    pool = [candidate("dear", 9.0), candidate("cheap", 1.0, inflight=3), candidate("mid", 2.0),
            candidate("near", 1.0 + ECONOMY_PRICE_BAND / 2), candidate("beyond", 1.0 + 2 * ECONOMY_PRICE_BAND)]
    planned = plan(pool, "economy")
    # Least load within the band (near has no call in flight), then the rest by price.
    assert ids(planned) == ["near", "cheap", "beyond", "mid", "dear"]
    assert planned.budget is not None and (planned.budget.instances, planned.budget.of) == (2, 5)
    # An instance declaring no price counts as free: it is the cheapest.
    assert ids(plan([*pool, candidate("free", None)], "economy"))[0] == "free"
    # A sticky instance outside the band does not go first: the label wins over stickiness.
    assert ids(plan(pool, "economy", sticky="dear"))[:2] == ["near", "cheap"]
    assert ids(plan(pool, "economy", sticky="cheap"))[0] == "cheap"
    # No label, standard and premium: the pool whole, in the policy's order.
    assert ids(plan(pool, None))[-1] == "cheap" and plan(pool, None).budget is None
    premium = plan(pool, "premium")
    assert premium.budget is not None and (premium.budget.instances, premium.budget.of) == (5, 5)


def test_the_sla_comes_before_price_and_price_alone_decides_when_no_instance_meets_it():
    slow_cheap, fast_mid, fast_dear = candidate("slow-cheap", 1.0, latency_ms=500), \
        candidate("fast-mid", 2.0, latency_ms=5), candidate("fast-dear", 9.0, latency_ms=5)
    planned = plan([fast_dear, slow_cheap, fast_mid], "economy")
    # Past its SLA the cheapest is the last resort: after every instance meeting its SLA, whatever their price.
    assert ids(planned) == ["fast-mid", "fast-dear", "slow-cheap"]
    assert planned.budget is not None and planned.budget.reference_price == 2.0
    every_slow = [candidate("slow-dear", 9.0, latency_ms=500), slow_cheap]
    assert ids(plan(every_slow, "economy")) == ["slow-cheap", "slow-dear"]
