"""Which instances to try for one call, in order: filters first, then the capability's policy.

hint filter, then version constraints (both hard; never route elsewhere) -> state tier (healthy, else
pending and demoted, degraded) -> availability (breakers, ejections; ignored in panic) -> capacity
(max_qps; none left is BUSY) -> quality floor (unless none would be left) -> budget label (economy: the
cheapest band first) -> policy order within the band -> sticky instance first -> the rest, cheapest first.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import msgspec
from agent_reach.atp import BudgetRoute, ErrorCode
from agent_reach.hint import matches_hint, unsatisfied_hint
from agent_reach.registration import RoutingPolicy
from agent_reach.versions import parse_constraint, parse_version, satisfies

from router.candidate import Candidate
from router.hashring import HashRing
from router.scoring import Scoring, by_score, meets_sla

HEALTHY = "healthy"
DEGRADED_STATES = frozenset({"pending", "demoted"})
# Economy's tolerance: reference prices within this share above the cheapest count as the cheapest, so
# instances priced alike but for rounding share the calls rather than the lowest taking them all.
ECONOMY_PRICE_BAND = 0.05


class RoutePlan(msgspec.Struct, kw_only=True):
    """The instances to try, first choice first; the rest are the failover order.

    ``panic``: too few instances were available, so availability was ignored; the caller must
    not filter the order by breakers again. ``reason``: why a degraded plan is degraded, the state
    of its first choice ("pending" or "demoted"); None when healthy instances serve. ``budget``: what
    the call's budget label did (None: no label, or "standard").
    """

    order: list[Candidate]
    policy: RoutingPolicy
    degraded: bool
    panic: bool
    reason: str | None = None
    budget: BudgetRoute | None = None


class EconomySplit(msgspec.Struct, kw_only=True):
    """An economy call's pool split: ``band`` the cheapest instances meeting their SLA, which the policy orders;
    ``rest`` the others, cheapest first (those meeting their SLA first), the failover order after the band;
    ``price`` the band's reference price (None: no instance of the pool declares one)."""

    band: list[Candidate]
    rest: list[Candidate]
    price: float | None


class RouteRefusal(msgspec.Struct, kw_only=True):
    """Why no call may be sent; ``code`` selects the error frame."""

    code: ErrorCode
    reason: str


def session_hash_key(context: dict[str, Any], request_id: str) -> str:
    """What the ``hash`` policy hashes: the session, or the request when there is no session."""
    session = context.get("session_id")
    return str(session) if session is not None and session != "" else request_id


def choose_policy(capability_policy: RoutingPolicy | None, instance_preferences: list[RoutingPolicy | None],
                  default: RoutingPolicy) -> RoutingPolicy:
    """The capability's policy wins; else the instances' most common preference (ties: by name); else default."""
    if capability_policy is not None:
        return capability_policy
    if not any(instance_preferences):
        return default
    votes = Counter(preference for preference in instance_preferences if preference is not None)
    return min(votes, key=lambda preference: (-votes[preference], preference))


def plan_route(
    candidates: list[Candidate],
    *,
    policy_name: RoutingPolicy,
    hash_key: str,
    routing_hint: dict[str, Any] | None,
    sticky_agent: str | None,
    rng: random.Random,
    panic_threshold: float = 0.5,
    p2c_above: int = 8,
    versions: tuple[str, ...] = (),
    allow_degraded: bool = True,
    scoring: Scoring | None = None,
    quality_floor: float | None = None,
    budget: object = None,
) -> RoutePlan | RouteRefusal:
    """Order the candidates to try for one call, or say why none may be tried. ``versions``: constraints
    (already validated) every candidate's version must satisfy: the frame's, a rule's, a canary's.
    ``allow_degraded`` False (an L0 capability): pending and demoted instances are never used.
    ``scoring``: the scored policy's weights. ``quality_floor``: instances whose posted quality is
    below it are left out, under any policy, unless none would be left. ``budget``: the call's
    ``context.budget`` (validated at the edge; anything but "economy" or "premium" is no label)."""
    if not candidates:
        return RouteRefusal(code=ErrorCode.NO_ROUTABLE_INSTANCE, reason="the capability has no registered instance")
    matching = candidates
    if routing_hint:
        matching = [candidate for candidate in candidates if matches_hint(candidate.metadata, routing_hint)]
        if not matching:
            return RouteRefusal(code=ErrorCode.ROUTING_HINT_UNSATISFIABLE, reason=unsatisfied_hint(routing_hint))
    if versions:
        within = versions_filter(matching, versions)
        if not within:
            offered = ", ".join(sorted({candidate.version for candidate in matching}))
            return RouteRefusal(code=ErrorCode.VERSION_UNSATISFIABLE,
                                reason=f"no instance's version satisfies {' and '.join(versions)} (offered: {offered})")
        matching = within
    tier = [candidate for candidate in matching if candidate.state == HEALTHY]
    degraded = not tier
    if degraded and not allow_degraded:
        return RouteRefusal(code=ErrorCode.NO_ROUTABLE_INSTANCE,
                            reason="no instance is healthy (an L0 capability never uses pending or demoted ones)")
    if degraded:
        tier = [candidate for candidate in matching if candidate.state in DEGRADED_STATES]
    if not tier:
        return RouteRefusal(code=ErrorCode.NO_ROUTABLE_INSTANCE, reason="no instance is healthy, pending or demoted")
    available = [candidate for candidate in tier if candidate.available]
    panic = len(available) < panic_threshold * len(tier)
    pool = [candidate for candidate in (tier if panic else available) if candidate.has_capacity]
    if not pool:
        return RouteRefusal(code=ErrorCode.BUSY, reason="every eligible instance is at its max_qps")
    if quality_floor is not None:
        pool = [candidate for candidate in pool if candidate.quality is None or candidate.quality >= quality_floor] \
            or pool
    labelled: BudgetRoute | None = None
    rest: list[Candidate] = []
    if budget == "economy":
        split = economy_split(pool)
        labelled = BudgetRoute(label="economy", reference_price=split.price, instances=len(split.band), of=len(pool))
        pool, rest = split.band, split.rest
    elif budget == "premium":  # price ignored: the whole pool (the scored policy weighs cost 0, see scoring_of)
        labelled = BudgetRoute(label="premium", reference_price=None, instances=len(pool), of=len(pool))
    order = _ORDERS[policy_name](pool, candidates, hash_key, rng, p2c_above, scoring)
    if sticky_agent is not None:
        order.sort(key=lambda candidate: candidate.agent_id != sticky_agent)
    if rest:
        order += rest
    return RoutePlan(order=order, policy=policy_name, degraded=degraded, panic=panic,
                     reason=order[0].state if degraded else None, budget=labelled)


def economy_split(pool: list[Candidate]) -> EconomySplit:
    """The band: among the instances meeting their SLA (EWMA latency within timeout_sla_ms, or not measured
    yet; none does: all of them), those whose reference price is within ECONOMY_PRICE_BAND above the cheapest.
    An instance declaring no price counts as free, so with no price anywhere the band is the whole pool."""
    # One pass for the figures (loops, not generators: this runs on every economy call): (misses its SLA, price).
    keyed = []
    cheapest = math.inf  # among those meeting their SLA
    declared = False
    for candidate in pool:
        price, misses = candidate.cost or 0.0, not meets_sla(candidate)
        declared = declared or candidate.cost is not None
        if not misses and price < cheapest:
            cheapest = price
        keyed.append((misses, price, candidate))
    judge_all = cheapest == math.inf  # none meets its SLA: price alone decides
    if judge_all:
        cheapest = min(price for _misses, price, _candidate in keyed)
    ceiling = cheapest * (1 + ECONOMY_PRICE_BAND)
    band: list[Candidate] = []
    rest: list[tuple[bool, float, Candidate]] = []
    for entry in keyed:
        if (judge_all or not entry[0]) and entry[1] <= ceiling:
            band.append(entry[2])
        else:
            rest.append(entry)
    rest.sort(key=_sla_then_price)
    return EconomySplit(band=band, rest=[entry[2] for entry in rest], price=cheapest if declared else None)


def _sla_then_price(entry: tuple[bool, float, Candidate]) -> tuple[bool, float]:
    return entry[0], entry[1]


def versions_filter(candidates: list[Candidate], versions: tuple[str, ...]) -> list[Candidate]:
    """The candidates whose version satisfies every constraint."""
    intervals = [parse_constraint(text) for text in versions]
    kept = []
    for candidate in candidates:  # loops, not all(generator): this runs on every call with a constraint
        version = parse_version(candidate.version)
        for interval in intervals:
            if not satisfies(version, interval):
                break
        else:
            kept.append(candidate)
    return kept


def _by_load(pool: list[Candidate], candidates: list[Candidate], hash_key: str, rng: random.Random,
             p2c_above: int, scoring: Scoring | None) -> list[Candidate]:
    """Ascending in-flight + load, ties in random order so idle instances share the calls.

    On pools larger than ``p2c_above`` the first choice is the better of two random picks (power of
    two choices): nearly as good as the minimum, without every router herding onto the same
    instance between load reports. The rest follow ascending as the failover order.
    """
    if len(pool) == 1:
        return list(pool)
    shuffled = rng.sample(pool, len(pool))
    order = sorted(shuffled, key=_score)
    if len(pool) <= p2c_above:
        return order
    first = min(shuffled[:2], key=_score)
    order.remove(first)
    return [first, *order]


def _by_hash(pool: list[Candidate], candidates: list[Candidate], hash_key: str, rng: random.Random,
             p2c_above: int, scoring: Scoring | None) -> list[Candidate]:
    """The ring's preference order for ``hash_key``, over every instance of the capability.

    The ring spans all candidates, not just the eligible ones, so it is rebuilt only when the
    capability's membership changes; leaving out ineligible nodes gives the same order a ring of
    the eligible ones would.
    """
    by_id = {candidate.agent_id: candidate for candidate in pool}
    ring = _ring_of(frozenset(candidate.agent_id for candidate in candidates))
    return [by_id[agent_id] for agent_id in ring.preference(hash_key) if agent_id in by_id]


def _score(candidate: Candidate) -> float:
    return candidate.inflight + candidate.load


@lru_cache(maxsize=256)
def _ring_of(members: frozenset[str]) -> HashRing:
    return HashRing(members)


_Order = Callable[[list[Candidate], list[Candidate], str, random.Random, int, Scoring | None], list[Candidate]]
_ORDERS: dict[RoutingPolicy, _Order] = {
    "least_load": _by_load,
    # Affinity's hard part is the hint filter, applied under every policy; among matches, least load.
    "affinity": _by_load,
    "hash": _by_hash,
    "scored": by_score,
}
