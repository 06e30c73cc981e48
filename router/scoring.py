"""The scored policy: each instance's score from what this router measured, and the order it gives.

Every part is normalised against a FIXED bound to 0 (best) .. 1 (worst), never against the worst figure
seen lately (one outlier would rescale every other instance's part):

- latency: log(1 + EWMA ms) / log(1 + the capability's timeout_sla_ms), capped at 1. On a log scale because
  agent latencies differ by orders of magnitude: 5 ms against 20 ms weighs about as much as 20 ms against 80 ms.
- errors: the failure share of the last calls (router/measurements.py), as is.
- load: the load the instance reported (0..1) + the router's calls in flight to it / ``LOAD_BOUND`` (10), capped
  at 1: an instance saying it is full, or holding 10 of this router's calls, is fully loaded.
- cost: the instance's price for ``REFERENCE_USAGE`` (a call of 1,000 input and 1,000 output tokens; per-call
  prices count whole) / the highest such price among the capability's instances. Prices are declared, not
  measured, so this bound moves only when a registration changes. No price declared: 0.
- quality: 1 - the score an operator posted for the instance (0..1); none posted: 0.

The score is the weighted mean of the parts (weights from the policy, ``DEFAULT_WEIGHTS`` otherwise): lower
is better. An instance never measured has latency and errors 0, an optimistic prior: it is tried first.

The order: ascending score; but with probability n x ``explore_share`` (n instances in the pool; at most
``MAX_EXPLORATION``) the first choice is instead an instance drawn uniformly (the rest keep their order), so
each instance gets at least explore_share of the calls (0.5 / n when n x explore_share is over 0.5: half the
calls always go by score) and its figures stay fresh. Budget labels (``context.budget``): "premium" weighs cost 0;
"economy" narrows the pool to the cheapest band before any policy orders it (router/selection.py), so an
economy call's exploration pick is one of the cheapest too.
"""

from __future__ import annotations

import math
import random

import msgspec
from agent_reach.atp import ScoreParts
from agent_reach.registration import Capability
from agent_reach.usage import Usage, call_cost

from mesh.policy import DEFAULT_EXPLORE_SHARE, DEFAULT_WEIGHTS, Policy, ScoreWeights
from router.candidate import Candidate, Score

LOAD_BOUND = 10.0
MAX_EXPLORATION = 0.5
REFERENCE_USAGE = Usage(input_tokens=1000, output_tokens=1000)


class Scoring(msgspec.Struct, kw_only=True, frozen=True):
    """What the scored order needs from the capability's policy and the call's budget label."""

    weights: ScoreWeights = DEFAULT_WEIGHTS
    explore_share: float = DEFAULT_EXPLORE_SHARE


DEFAULT_SCORING = Scoring()


def scoring_of(policy: Policy, budget: object) -> Scoring:
    """The policy's weights (``cost_sensitivity`` applied) for a call with ``budget``: "premium" weighs cost 0
    (economy's narrowing is the selection's, under every policy; anything else: the policy's weights)."""
    weights = policy.score_weights
    if budget == "premium":
        weights = msgspec.structs.replace(weights, cost=0.0)
    return Scoring(weights=weights, explore_share=policy.exploration)


def reference_cost(capability: Capability) -> float | None:
    """What a reference call costs at the capability's declared prices (None: none declared)."""
    return call_cost(capability, REFERENCE_USAGE)


def parts_of(candidate: Candidate, cost_bound: float) -> ScoreParts:
    measured = candidate.measured
    latency_ms = measured.latency_ms if measured is not None else None
    return ScoreParts(
        latency=min(1.0, math.log1p(latency_ms) / math.log1p(candidate.sla_ms)) if latency_ms is not None else 0.0,
        errors=measured.error_rate if measured is not None else 0.0,
        load=min(1.0, candidate.load + candidate.inflight / LOAD_BOUND),
        cost=candidate.cost / cost_bound if candidate.cost and cost_bound > 0 else 0.0,
        quality=1.0 - candidate.quality if candidate.quality is not None else 0.0)


def cost_bound(candidates: list[Candidate]) -> float:
    """The highest reference price among the capability's instances (0: none declares one)."""
    bound = 0.0
    for candidate in candidates:  # a loop, not max(generator): this runs on every scored call
        if candidate.cost is not None and candidate.cost > bound:
            bound = candidate.cost
    return bound


def score(candidates: list[Candidate], pool: list[Candidate], weights: ScoreWeights) -> None:
    """Set ``score`` on every candidate of ``pool`` (``candidates``: all of the capability's, for the cost bound):
    the weighted mean of its parts (0 when every weight is 0: every instance scores alike)."""
    bound = cost_bound(candidates)
    whole = weights.whole
    scale = 1.0 / whole if whole > 0 else 0.0
    latency, errors, load = weights.latency * scale, weights.errors * scale, weights.load * scale
    cost, quality = weights.cost * scale, weights.quality * scale
    for candidate in pool:
        parts = parts_of(candidate, bound)
        candidate.score = Score(total=latency * parts.latency + errors * parts.errors + load * parts.load
                                + cost * parts.cost + quality * parts.quality, parts=parts)


def _total(candidate: Candidate) -> float:
    return candidate.score.total if candidate.score is not None else 0.0


def meets_sla(candidate: Candidate) -> bool:
    """Whether its EWMA latency is within the capability's SLA (not measured yet: assumed so)."""
    measured = candidate.measured
    return measured is None or measured.latency_ms is None or measured.latency_ms <= candidate.sla_ms


def by_score(pool: list[Candidate], candidates: list[Candidate], hash_key: str, rng: random.Random,
             p2c_above: int, scoring: Scoring | None) -> list[Candidate]:
    """The scored policy's order (see the module): ``pool`` scored, best first, maybe an exploration pick first."""
    scoring = scoring or DEFAULT_SCORING
    score(candidates, pool, scoring.weights)
    order = sorted(pool, key=_total)
    if len(order) > 1 and rng.random() < min(MAX_EXPLORATION, scoring.explore_share * len(order)):
        pick = order.pop(rng.randrange(len(order)))
        assert pick.score is not None
        pick.score = msgspec.structs.replace(pick.score, explored=True)
        order.insert(0, pick)
    return order


class InstanceScore(msgspec.Struct, kw_only=True, frozen=True):
    """One instance as GET /scores/{capability} shows it: its score and parts, and the figures behind them."""

    agent_id: str
    state: str
    score: float
    parts: ScoreParts
    latency_ms: float | None  # the EWMA; None: no answered call yet
    error_rate: float
    samples: int  # counted calls in the error window
    inflight: int
    load: float
    cost: float | None  # a reference call's price
    quality: float | None
    below_quality_floor: bool


def explain(candidates: list[Candidate], weights: ScoreWeights, quality_floor: float | None) -> list[InstanceScore]:
    """Every instance's standard score (no budget label), best first."""
    score(candidates, candidates, weights)
    shown = []
    for candidate in candidates:
        assert candidate.score is not None
        measured = candidate.measured
        shown.append(InstanceScore(
            agent_id=candidate.agent_id, state=candidate.state, score=candidate.score.total,
            parts=candidate.score.parts, latency_ms=measured.latency_ms if measured is not None else None,
            error_rate=measured.error_rate if measured is not None else 0.0,
            samples=measured.samples if measured is not None else 0, inflight=candidate.inflight,
            load=candidate.load, cost=candidate.cost, quality=candidate.quality,
            below_quality_floor=quality_floor is not None and candidate.quality is not None
            and candidate.quality < quality_floor))
    return sorted(shown, key=lambda shown_score: shown_score.score)
