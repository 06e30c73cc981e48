"""Choice: which capability a call goes to and which of its instances are tried, in what order. A frame
without a capability is matched by meaning (router/intents.py); the capability's rule table (router/rules.py)
and version split (router/canary.py) may send the call elsewhere or narrow it; the route plan
(router/selection.py) orders the instances that remain. Nothing here sends a call."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import msgspec
from agent_reach.atp import ErrorCode, RequestFrame, RouteFacts
from agent_reach.registration import RoutingPolicy

from mesh.policy import Policy, SplitShare
from router.auth import Caller, Unauthenticated, authorize
from router.budgets import Budgets
from router.call import CallResult, error_result
from router.canary import assign, share_point
from router.candidate import Candidate
from router.instances import InstanceBook
from router.measurements import Measurements
from router.mirror import RegistryMirror
from router.plan import CallPlans, InstancePlan
from router.rules import CallerFacts, CandidatesOf, Decision, decide, minute_of_week, ordered, serviceable
from router.scoring import InstanceScore, explain, scoring_of
from router.selection import RoutePlan, RouteRefusal, plan_route, session_hash_key
from router.shadow import RuleBook
from router.sticky import StickyTable
from semantic.outcome import IntentMatch, IntentRefusal

if TYPE_CHECKING:
    from router.intents import SemanticRouter


class Choice:
    """The router's choices for one call; each is counted in ``decisions``."""

    def __init__(self, mirror: RegistryMirror, plans: CallPlans, book: InstanceBook, measurements: Measurements,
                 budgets: Budgets, rules: RuleBook, sticky: StickyTable, rng: random.Random, decisions: Counter[str], *,
                 panic_threshold: float, semantic: SemanticRouter | None):
        self.mirror = mirror
        self.plans = plans
        self.book = book
        self.measurements = measurements
        self.budgets = budgets
        self.rules = rules
        self.sticky = sticky
        self.rng = rng
        self.decisions = decisions
        self.panic_threshold = panic_threshold
        self.semantic = semantic

    async def intent(self, frame: RequestFrame, started: float) -> IntentMatch | CallResult | None:
        """For a frame naming no capability: the one its intent matches (set on the frame), or the answer
        refusing it; None when there is no intent to match (the call goes on naming none)."""
        if self.semantic is None:
            return error_result(frame, ErrorCode.INVALID_FRAME,
                                "capability is required (semantic matching is off, so intent cannot stand for it)",
                                RouteFacts(), started, ledgered=False)
        if not frame.intent:
            return None
        resolved = await self.semantic.resolve(frame.intent)
        if isinstance(resolved, IntentRefusal):
            self.decisions[resolved.code.value.lower()] += 1
            return error_result(frame, resolved.code, resolved.message,
                                RouteFacts(intent_candidates=resolved.candidates, intent_stages=resolved.stages),
                                started, ledgered=False)
        self.decisions["semantic"] += 1
        frame.capability = resolved.capability  # in place: the trace and audit row name the matched capability
        return resolved

    def candidates_of(self, caller: Caller | Unauthenticated | None) -> CandidatesOf:
        """The instances of a capability as rules, splits and the attempt see them during one call (built on first
        use, then kept); none when the caller may not call it."""
        now = time.monotonic()
        known: dict[str, list[Candidate]] = {}

        def candidates_of(name: str) -> list[Candidate]:
            found = known.get(name)
            if found is not None:
                return found
            plan = self.plans.of(name)
            if plan is None or (isinstance(caller, Caller) and authorize(caller, name, plan) is not None):
                found = []
            else:
                found = [self.candidate(instance, name, plan.policy, now) for instance in plan.instances.values()]
            known[name] = found
            return found
        return candidates_of

    def candidate(self, instance: InstancePlan, capability: str, policy: Policy, now: float) -> Candidate:
        offer, max_qps = instance.offer, instance.max_qps
        agent_id = offer.record.agent_id
        return Candidate(
            agent_id=agent_id, endpoint=offer.capability.endpoint, protocol=offer.capability.protocol,
            state=offer.state.state, load=offer.state.load, inflight=self.book.inflight.get(agent_id, 0),
            metadata=offer.record.metadata, max_qps=max_qps,
            available=self.book.available(capability, agent_id, policy.circuit_breaker, now),
            has_capacity=max_qps <= 0 or self.book.bucket(agent_id, max_qps).available(now) >= 1,
            version=offer.version, measured=self.measurements.get(capability, agent_id),
            cost=instance.cost, quality=self.mirror.quality(capability, agent_id),
            sla_ms=offer.capability.timeout_sla_ms,
        )

    def decision(self, frame: RequestFrame, capability: str, policy: Policy, caller: Caller | Unauthenticated | None,
                 candidates_of: CandidatesOf) -> Decision:
        """The rule table's decision for this call; shadow rules are judged once the call is answered."""
        table = ordered(policy.rule_list)
        rules = table.rules
        now = minute_of_week(time.time())
        # The budget's use is looked up only for a table that asks: other calls pay nothing for it.
        facts = CallerFacts(client_id=caller.client_id, trust_level=caller.trust_level, minute_of_week=now,
                            budget_used=self.budgets.used_fraction(caller.client_id) if table.uses_budget else None) \
            if isinstance(caller, Caller) else CallerFacts(minute_of_week=now)
        decision = decide(rules, capability, frame.context, frame.version, facts, candidates_of)
        self.decisions["rule" if decision.rule else "no_rule"] += 1
        if decision.rule is not None:
            self.rules.hit(capability, decision.rule)
        if table.has_shadow:
            # After this call's answer is on its way: shadow rules cost the live call nothing.
            asyncio.get_running_loop().call_soon(self.rules.judge, rules, capability, frame.context,
                                                 frame.version, facts, candidates_of, decision)
        return decision

    @staticmethod
    def share(frame: RequestFrame, capability: str, policy: Policy, decision: Decision,
              candidates_of: CandidatesOf) -> SplitShare | None:
        """The split share this call's session belongs to; when that share has no instance to serve it, the
        heaviest share that has one (none has: the assigned share, whose refusal names the versions offered)."""
        index = assign(policy.shares, share_point(capability, session_hash_key(frame.context, frame.request_id)))
        if index is None:
            return None
        assigned = policy.shares[index]

        def serves(share: SplitShare) -> bool:
            return serviceable(msgspec.structs.replace(decision, versions=(*decision.versions, share.version)),
                               candidates_of)
        if serves(assigned):
            return assigned
        heaviest_first = sorted((share for share in policy.shares if share.weight), key=lambda share: -share.weight)
        return next((share for share in heaviest_first if serves(share)), assigned)

    def plan(self, frame: RequestFrame, candidates: list[Candidate], policy: Policy, policy_name: RoutingPolicy,
             sticky: str | None, narrowed: Decision | None, now: float) -> RoutePlan | RouteRefusal:
        """The instances to try, in order (``sticky``: the call's affinity key), or why none may be tried."""
        budget = frame.context.get("budget")
        plan = plan_route(candidates, policy_name=policy_name,
                          hash_key=session_hash_key(frame.context, frame.request_id),
                          # The hint is an object or None (checked at the edge); a rule's zone narrows it.
                          routing_hint=_with_zone(frame.context.get("routing_hint"), narrowed),
                          sticky_agent=self.sticky.get(sticky, now) if sticky else None,
                          rng=self.rng, panic_threshold=self.panic_threshold,
                          versions=narrowed.versions if narrowed else (),
                          allow_degraded=policy.degradation_config.level != "L0",
                          scoring=scoring_of(policy, budget) if policy_name == "scored" else None,
                          quality_floor=policy.min_quality, budget=budget)
        if isinstance(plan, RoutePlan):
            self.decisions[policy_name] += 1
            if plan.reason is not None:
                self.decisions[plan.reason] += 1
        return plan

    def scores(self, capability: str) -> tuple[RoutingPolicy, list[InstanceScore]] | None:
        """The policy ordering ``capability`` and every instance's score as the scored policy sees it now
        (None: no instance offers it)."""
        plan = self.plans.of(capability)
        if plan is None:
            return None
        now = time.monotonic()
        candidates = [self.candidate(instance, capability, plan.policy, now) for instance in plan.instances.values()]
        return plan.routing, explain(candidates, plan.policy.score_weights, plan.policy.min_quality)


def _with_zone(hint: dict[str, Any] | None, narrowed: Decision | None) -> dict[str, Any] | None:
    """The caller's routing hint narrowed to a rule's zone (a zone is a metadata label like any hint's)."""
    return hint if narrowed is None or narrowed.zone is None else {**(hint or {}), "zone": narrowed.zone}
