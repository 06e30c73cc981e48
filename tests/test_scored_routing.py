"""The scored policy end to end: real agents on loopback at 5 / 20 / 80 ms, a real registry and router.

The router's random draws (exploration) are seeded, so which calls explore is the same on every run; which
instance an exploration pick lands on, and everything else, comes from the agents' real latencies.
"""

from __future__ import annotations

from collections import Counter

import pytest

from agent_support import Agent
from agentreach.cli import build_parser
from conftest import wait_for
from router.core import RouterSettings
from router_support import Answer, Mesh

SEED = 15
# Registered slowest first: without measurements, listing order would favour the slow one.
DELAYS = {"slow": 0.080, "mid": 0.020, "fast": 0.005}
EXPLORE_SHARE = 0.1
# docs/atp.md "Scored routing": the first choices an instance keeps once its latency has doubled past the next
# best's.
SHIFT_CALLS = 2


async def three(mesh: Mesh, start_agent, policy: dict | None = None) -> dict[str, Agent]:
    agents = {name: await start_agent(name) for name in DELAYS}
    for name, agent in agents.items():
        agent.first_byte_delay = DELAYS[name]
    await mesh.add_all(list(agents.values()))
    await mesh.put_policy("echo", {"policy": "scored", "explore_share": EXPLORE_SHARE, **(policy or {})})
    mesh.router._rng.seed(SEED)
    return agents


async def calls(mesh: Mesh, count: int, **frame) -> list[Answer]:
    return [await mesh.call(payload=n, **frame) for n in range(count)]


def first_choices(answers: list[Answer]) -> Counter[str]:
    """Where calls went on merit (exploration picks left out)."""
    return Counter(answer.route["instance"] for answer in answers if not answer.route.get("explored"))


async def test_most_calls_go_to_the_fastest_and_none_is_starved(mesh: Mesh, start_agent):
    await three(mesh, start_agent)
    answers = await calls(mesh, 200)
    assert {answer.status for answer in answers} == {200}
    served = Counter(answer.route["instance"] for answer in answers)
    assert served["fast"] > 100, served
    # Every instance gets at least explore_share of the calls; half of it is the tolerance for chance.
    assert min(served[name] for name in DELAYS) >= EXPLORE_SHARE * 200 / 2, served
    explored = [answer for answer in answers if answer.route.get("explored")]
    assert 0 < len(explored) < 200 and {answer.route["policy"] for answer in answers} == {"scored"}
    route = answers[-1].route
    assert set(route["score_parts"]) == {"latency", "errors", "load", "cost", "quality"}
    assert 0 <= route["score"] <= 1


async def test_traffic_leaves_the_fast_instance_once_it_slows_down(mesh: Mesh, start_agent):
    agents = await three(mesh, start_agent)
    warm = await calls(mesh, 60)
    assert first_choices(warm[-20:]).most_common(1)[0][0] == "fast"
    agents["fast"].first_byte_delay = 0.5
    after = await calls(mesh, 40)
    assert first_choices(after)["fast"] <= SHIFT_CALLS, first_choices(after)
    # From then on the 20 ms instance is the first choice.
    assert first_choices(after[-20:]).most_common(1)[0][0] == "mid"


async def test_an_instance_answering_business_errors_loses_traffic(mesh: Mesh, start_agent):
    # Errors weighed 20 to latency's 1: one failure among its last 20 calls (a part of 0.05) outweighs any lead in
    # latency (a part of at most 1), however the machine's load jitters the agents' latencies.
    agents = await three(mesh, start_agent, {"weights": {"errors": 20}})
    warm = await calls(mesh, 60)
    assert first_choices(warm[-20:]).most_common(1)[0][0] == "fast"
    agents["fast"].business_error = {"code": "model_confused"}
    after = await calls(mesh, 40)
    assert first_choices(after)["fast"] <= 1, first_choices(after)
    failed = [answer for answer in after if answer.status != 200]
    assert failed and {answer.body["error_code"] for answer in failed} == {"BUSINESS_ERROR"}
    assert {answer.route["instance"] for answer in failed} == {"fast"}


async def test_scores_lists_every_instance_with_its_figures(mesh: Mesh, start_agent):
    await three(mesh, start_agent)
    await calls(mesh, 30)
    scores = await mesh.get("/scores/echo")
    assert scores["policy"] == "scored" and scores["explore_share"] == EXPLORE_SHARE
    listed = {row["agent_id"]: row for row in scores["instances"]}
    assert set(listed) == set(DELAYS)
    assert listed["fast"]["latency_ms"] < listed["slow"]["latency_ms"]
    assert listed["fast"]["parts"]["latency"] < listed["slow"]["parts"]["latency"]
    assert [row["score"] for row in scores["instances"]] == sorted(row["score"] for row in scores["instances"])


PRICES = {"slow": 0.001, "mid": 0.01, "fast": 0.1}  # the fastest is the dearest


async def priced(mesh: Mesh, start_agent, sla_ms: dict[str, int] | None = None) -> dict[str, Agent]:
    agents = {name: await start_agent(name) for name in DELAYS}
    for name, agent in agents.items():
        agent.first_byte_delay = DELAYS[name]
        await mesh.add(agent, "echo", healthy=False, cost_per_call=PRICES[name],
                       timeout_sla_ms=(sla_ms or {}).get(name, 5000))
    await mesh.ready(*agents)
    await mesh.put_policy("echo", {"policy": "scored", "explore_share": EXPLORE_SHARE})
    mesh.router._rng.seed(SEED)
    return agents


async def test_economy_takes_the_cheapest_and_premium_the_best_regardless_of_price(mesh: Mesh, start_agent):
    await priced(mesh, start_agent)
    economy = await calls(mesh, 20, context={"budget": "economy"})
    assert Counter(answer.route["instance"] for answer in economy) == {"slow": 20}
    assert not any(answer.route.get("explored") for answer in economy)
    await calls(mesh, 40)  # standard calls: every instance measured
    premium = await calls(mesh, 20, context={"budget": "premium"})
    assert first_choices(premium).most_common(1)[0][0] == "fast"
    # Its part for cost is the worst there is (the highest price): premium weighs it at 0.
    assert {answer.route["score_parts"]["cost"] for answer in premium if answer.route["instance"] == "fast"} == {1.0}


async def test_economy_moves_on_when_the_cheapest_misses_its_sla(mesh: Mesh, start_agent):
    await priced(mesh, start_agent, sla_ms={"slow": 40})  # answers in 80 ms: every call times out
    economy = await calls(mesh, 6, context={"budget": "economy"})
    served = [answer.route["instance"] for answer in economy]
    assert served[0] == "slow" and economy[0].status == 504
    assert served[1:] == ["mid"] * 5 and {answer.status for answer in economy[1:]} == {200}


async def test_a_budget_label_the_router_does_not_know_is_refused(mesh: Mesh, start_agent):
    agent = await start_agent("echo-1")
    await mesh.add(agent, "echo")
    answer = await mesh.call(context={"budget": "cheap"})
    assert answer.status == 400 and answer.body["error_code"] == "INVALID_FRAME"
    assert answer.body["field"] == "context.budget" and agent.calls == 0


@pytest.mark.parametrize(("body", "field"), [
    ({"weights": {"speed": 1}}, "weights.speed"),
    ({"weights": {"latency": -1}}, "weights.latency"),
    ({"explore_share": 0.6}, "explore_share"),
    ({"explore_share": -0.01}, "explore_share"),
    ({"quality_floor": 1.5}, "quality_floor"),
    ({"weights": {"cost_sensitivity": 0.95}}, "weights.cost_sensitivity"),
    ({"weights": {"cost": 1, "cost_sensitivity": 0.5}}, "weights.cost_sensitivity"),
    ({"weights": {"latency": 0, "errors": 0, "load": 0, "quality": 0}}, "weights"),
])
async def test_bad_scored_policy_is_refused_naming_the_field(registry, http, body, field):
    async with http.put(f"{registry.url}/policies/echo", json={"policy": "scored", **body}) as response:
        answer = await response.json()
    assert response.status == 400 and answer["field"] == field, answer
    assert registry.store.revision == 0


async def post_quality(mesh: Mesh, agent_id: str, score: float) -> None:
    async with mesh.http.put(f"{mesh.registry.url}/quality/echo/{agent_id}", json={"score": score},
                             headers=mesh.admin) as response:
        assert response.status == 200, await response.text()
    await wait_for(lambda: mesh.router.mirror.quality("echo", agent_id) == score,
                   what=f"the router to learn {agent_id}'s quality")


@pytest.mark.parametrize("policy", ["scored", "least_load"])
async def test_a_quality_floor_takes_an_instance_out_of_rotation_and_back(mesh: Mesh, start_agent, policy):
    agents = await three(mesh, start_agent, {"policy": policy, "quality_floor": 0.5})
    await post_quality(mesh, "fast", 0.2)
    below = await calls(mesh, 40)
    assert agents["fast"].calls == 0 and {answer.status for answer in below} == {200}
    listed = {row["agent_id"]: row for row in (await mesh.get("/scores/echo"))["instances"]}
    assert listed["fast"]["below_quality_floor"] and listed["fast"]["parts"]["quality"] == pytest.approx(0.8)
    await post_quality(mesh, "fast", 0.9)
    restored = await calls(mesh, 40)
    assert agents["fast"].calls > 0 and "fast" in {answer.route["instance"] for answer in restored}


async def test_below_the_floor_an_instance_still_serves_when_no_other_is_left(mesh: Mesh, start_agent):
    agent = await start_agent("only")
    await mesh.add(agent, "echo")
    await mesh.put_policy("echo", {"policy": "scored", "quality_floor": 0.5})
    await post_quality(mesh, "only", 0.1)
    answer = await mesh.call()
    assert answer.status == 200 and answer.route["instance"] == "only"


async def test_scores_are_for_operators_only(start_mesh, start_agent, http):
    mesh = await start_mesh(auth=True)
    await mesh.add(await start_agent("echo-1"), "echo")
    async with http.get(f"{mesh.url}/scores/echo") as response:
        assert response.status == 401
    assert [row["agent_id"] for row in (await mesh.get("/scores/echo"))["instances"]] == ["echo-1"]
    async with http.get(f"{mesh.url}/scores/nothing", headers=mesh.admin) as response:
        assert response.status == 404 and (await response.json())["field"] == "capability"


async def test_scored_can_be_the_routers_default_policy(start_mesh, start_agent):
    """`--default-policy scored`: a capability without a policy of its own is scored, with the default weights."""
    args = build_parser().parse_args(["router", "--registry", "http://127.0.0.1:1", "--default-policy", "scored"])
    mesh = await start_mesh(routing=RouterSettings(default_policy=args.default_policy))
    agents = {name: await start_agent(name) for name in DELAYS}
    await mesh.add_all(list(agents.values()))
    answer = await mesh.call(payload=1)
    assert answer.status == 200 and answer.route["policy"] == "scored"
    assert set(answer.route["score_parts"]) == {"latency", "errors", "load", "cost", "quality"}
