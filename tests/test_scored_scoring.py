"""The scored policy's pure parts: measurements, the parts and their bounds, weights, labels, exploration."""

from __future__ import annotations

import math
import random
from collections import Counter

import msgspec
import pytest
from agent_reach.atp import BusinessError, ErrorCode

from mesh.policy import Policy, ScoreWeights
from router.candidate import Candidate
from router.forward import AgentAnswer
from router.measurements import ERROR_WINDOW, LATENCY_ALPHA, TIMED_OUT_FACTOR, Measurements
from router.scoring import MAX_EXPLORATION, Scoring, by_score, scoring_of
from router.selection import RoutePlan, plan_route


def ok(ms: float) -> AgentAnswer:
    return AgentAnswer(result={}, elapsed_ms=ms)


def failed(code: ErrorCode, ms: float = 1.0, *, sent: bool = True, cut_short: bool = False) -> AgentAnswer:
    business = BusinessError(code="nope") if code is ErrorCode.BUSINESS_ERROR else None
    return AgentAnswer(error_code=code, elapsed_ms=ms, sent=sent, cut_short=cut_short, business_error=business)


def measured_after(*answers: AgentAnswer) -> Measurements:
    measurements = Measurements()
    for answer in answers:
        measurements.observe("echo", "a", answer)
    return measurements


def test_latency_is_an_ewma_and_a_timeout_counts_twice_its_elapsed_time():
    measured = measured_after(ok(10), ok(20)).get("echo", "a")
    assert measured is not None and measured.latency_ms == pytest.approx(10 + LATENCY_ALPHA * 10)
    timed_out = measured_after(ok(10), failed(ErrorCode.TOTAL_TIMEOUT, 100)).get("echo", "a")
    assert timed_out is not None
    assert timed_out.latency_ms == pytest.approx(10 + LATENCY_ALPHA * (100 * TIMED_OUT_FACTOR - 10))


def test_failures_count_by_the_breakers_rule():
    counted = measured_after(ok(1), failed(ErrorCode.BUSINESS_ERROR), failed(ErrorCode.AGENT_ERROR),
                             failed(ErrorCode.CONNECT_TIMEOUT, sent=False)).get("echo", "a")
    assert counted is not None and (counted.errors, counted.samples) == (3, 4)
    # The caller's doing, a busy agent, the router's own failure: nothing learnt about the instance.
    ignored = measured_after(failed(ErrorCode.INVALID_PAYLOAD), failed(ErrorCode.BUSY),
                             failed(ErrorCode.INTERNAL_ERROR), failed(ErrorCode.TOTAL_TIMEOUT, cut_short=True))
    assert ignored.get("echo", "a") is None
    # Nothing was sent: no latency to learn from a connection that failed.
    unreached = measured_after(failed(ErrorCode.CONNECT_TIMEOUT, 900, sent=False)).get("echo", "a")
    assert unreached is not None and unreached.latency_ms is None


def test_the_error_rate_covers_the_last_calls_only_and_instances_that_left_are_forgotten():
    measurements = measured_after(*[failed(ErrorCode.AGENT_ERROR)] * ERROR_WINDOW, *[ok(1)] * (ERROR_WINDOW // 2))
    measured = measurements.get("echo", "a")
    assert measured is not None and measured.error_rate == 0.5 and measured.samples == ERROR_WINDOW
    measurements.observe("other", "b", ok(1))
    measurements.forget({"b"})
    assert measurements.get("echo", "a") is None and measurements.get("other", "b") is not None


def candidate(agent_id: str, ms: float | None = None, *, errors: int = 0, cost: float | None = None,
              quality: float | None = None, inflight: int = 0, sla_ms: int = 5000) -> Candidate:
    measurements = Measurements()
    if ms is not None:
        for n in range(10):
            measurements.observe("echo", agent_id, failed(ErrorCode.AGENT_ERROR, ms) if n < errors else ok(ms))
    return Candidate(agent_id=agent_id, endpoint="http://127.0.0.1:9/call", protocol="rest", state="healthy",
                     measured=measurements.get("echo", agent_id), cost=cost, quality=quality, inflight=inflight,
                     sla_ms=sla_ms)


NO_EXPLORING = Scoring(explore_share=0)


def ranked(pool: list[Candidate], scoring: Scoring = NO_EXPLORING) -> list[str]:
    return [each.agent_id for each in by_score(pool, pool, "k", random.Random(1), 8, scoring)]


def test_parts_against_fixed_bounds():
    fast, slow = candidate("fast", 5, cost=1.0, quality=0.9, inflight=2), candidate("slow", 80, cost=4.0)
    by_score([fast, slow], [fast, slow], "k", random.Random(1), 8, NO_EXPLORING)
    assert fast.score is not None and slow.score is not None
    parts = fast.score.parts
    assert parts.latency == pytest.approx(math.log1p(5) / math.log1p(5000))
    assert (parts.load, parts.cost, parts.quality, slow.score.parts.cost) == pytest.approx((0.2, 0.25, 0.1, 1.0))
    # Past the SLA the part stays at its bound.
    beyond = candidate("beyond", 20_000)
    by_score([beyond], [beyond], "k", random.Random(1), 8, NO_EXPLORING)
    assert beyond.score is not None and beyond.score.parts.latency == 1.0


def test_best_score_first_and_an_unmeasured_instance_is_tried():
    assert ranked([candidate("slow", 80), candidate("fast", 5), candidate("mid", 20)]) == ["fast", "mid", "slow"]
    assert ranked([candidate("fast", 5), candidate("new")])[0] == "new"
    # Failures outweigh a small lead in latency.
    assert ranked([candidate("fast", 5, errors=3), candidate("mid", 20)]) == ["mid", "fast"]


def test_cost_sensitivity_trades_latency_for_price():
    pool = [candidate("fast", 5, cost=10.0), candidate("slow", 80, cost=1.0)]
    assert ranked(pool) == ["fast", "slow"]
    thrifty = Policy(weights=ScoreWeights(cost_sensitivity=0.5))
    assert thrifty.score_weights.cost == pytest.approx(ScoreWeights().whole)
    assert ranked(pool, scoring_of(msgspec.structs.replace(thrifty, explore_share=0), None)) == ["slow", "fast"]


def test_economy_takes_the_cheapest_meeting_its_sla_and_premium_ignores_price():
    dear, cheap, cheapest = candidate("dear", 5, cost=10.0), candidate("cheap", 20, cost=2.0), \
        candidate("cheapest", 900, cost=1.0, sla_ms=500)
    policy = Policy(weights=ScoreWeights(cost=100.0), explore_share=0)
    assert economy([dear, cheap, cheapest], policy) == ["cheap", "dear", "cheapest"]
    assert ranked([dear, cheap], scoring_of(policy, "standard")) == ["cheap", "dear"]
    assert ranked([dear, cheap], scoring_of(policy, "premium")) == ["dear", "cheap"]
    # Not measured yet: assumed within its SLA.
    assert economy([dear, candidate("new", cost=1.0)], policy)[0] == "new"


def economy(pool: list[Candidate], policy: Policy) -> list[str]:
    """The scored order of an economy call: the label narrows the pool first, as under every policy."""
    plan = plan_route(pool, policy_name="scored", hash_key="k", routing_hint=None, sticky_agent=None,
                      rng=random.Random(1), scoring=scoring_of(policy, "economy"), budget="economy")
    assert isinstance(plan, RoutePlan)
    return [each.agent_id for each in plan.order]


@pytest.mark.parametrize(("share", "instances", "least"), [(0.05, 3, 0.05), (0.2, 5, MAX_EXPLORATION / 5)])
def test_exploration_gives_every_instance_its_share(share, instances, least):
    pool = [candidate(f"i{n}", 5 * (n + 1)) for n in range(instances)]
    rng, calls = random.Random(7), 20_000
    first = Counter(by_score(pool, pool, "k", rng, 8, Scoring(explore_share=share))[0].agent_id for _ in range(calls))
    assert min(first.values()) >= least * calls * 0.9, first
    assert first["i0"] > calls / 2


def test_a_quality_floor_leaves_an_instance_out_under_any_policy_unless_none_is_left():
    good, poor = candidate("good", 80, quality=0.9), candidate("poor", 5, quality=0.1)
    for policy_name in ("scored", "least_load", "hash"):
        plan = plan_route([good, poor], policy_name=policy_name, hash_key="k", routing_hint=None, sticky_agent=None,
                          rng=random.Random(1), quality_floor=0.5)
        assert isinstance(plan, RoutePlan) and [each.agent_id for each in plan.order] == ["good"], policy_name
    alone = plan_route([poor], policy_name="scored", hash_key="k", routing_hint=None, sticky_agent=None,
                       rng=random.Random(1), quality_floor=0.5)
    assert isinstance(alone, RoutePlan) and [each.agent_id for each in alone.order] == ["poor"]
