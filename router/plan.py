"""A capability's call plan: what every call to it needs that changes only when the registry's view does.

Compiled on the first call after the mirror changes (its ``changes`` count: records or instance states),
then read by every call until the next change: the offers, the resolved policy, the routing policy that
orders them, the trust level they require, and per instance the facts an attempt reads. A call does
lookups and arithmetic on it, not merging and parsing (issue 30).
"""

from __future__ import annotations

import msgspec
from agent_reach.registration import RoutingPolicy, TrustLevel

from auth.grants import strictest
from mesh.policy import DEFAULT_POLICY, Policy
from router.mirror import Offer, RegistryMirror
from router.scoring import reference_cost
from router.selection import choose_policy
from router.timeouts import ResolvedTimeouts, resolve_timeouts


class InstancePlan(msgspec.Struct, frozen=True):
    """One offering instance as every call to the capability sees it until the view changes."""

    offer: Offer
    max_qps: float  # 0: unlimited (no bucket is asked)
    cost: float | None  # a reference call at its declared prices; None: it declares none
    timeouts: ResolvedTimeouts  # the policy's deadlines with this instance's SLA, before any caller's hint
    signing_key: str | None  # what calls to it are signed with; None: its token is unknown or revoked


class CallPlan(msgspec.Struct, frozen=True):
    capability: str
    offers: list[Offer]
    policy: Policy  # the stored policy, else the default one
    routing: RoutingPolicy  # what orders the instances (selection.choose_policy)
    required_trust: TrustLevel  # the strictest level any instance requires: a call may reach any of them
    instances: dict[str, InstancePlan]  # by agent_id, in the offers' order


def compile_plan(capability: str, offers: list[Offer], policy: Policy, default_routing: RoutingPolicy,
                 signing_keys: dict[str | None, str | None]) -> CallPlan:
    """``signing_keys``: each instance's token id to its signing key."""
    return CallPlan(
        capability=capability, offers=offers, policy=policy,
        routing=choose_policy(policy.policy, [offer.record.metadata.get("routing_policy") for offer in offers],
                              default_routing),
        required_trust=strictest(offer.capability.trust_level for offer in offers),
        instances={offer.record.agent_id: InstancePlan(
            offer=offer, max_qps=float(offer.record.metadata.get("max_qps") or 0),
            cost=reference_cost(offer.capability),
            timeouts=resolve_timeouts(policy.timeout, offer.capability.timeout_sla_ms, None),
            signing_key=signing_keys[offer.record.token_id]) for offer in offers})


class CallPlans:
    """Every capability's plan, dropped whole when the mirror changes and compiled again on first use."""

    def __init__(self, mirror: RegistryMirror, default_routing: RoutingPolicy):
        self.mirror = mirror
        self.default_routing = default_routing
        self._plans: dict[str, CallPlan] = {}
        self._changes = mirror.changes

    def of(self, capability: str) -> CallPlan | None:
        """None when no instance offers ``capability``."""
        if self._changes != self.mirror.changes:
            self._plans.clear()
            self._changes = self.mirror.changes
        plan = self._plans.get(capability)
        if plan is None:
            offers = self.mirror.offers(capability)
            if offers is None:
                return None
            auth = self.mirror.auth
            plan = self._plans[capability] = compile_plan(
                capability, offers, self.mirror.policy(capability) or DEFAULT_POLICY, self.default_routing,
                {offer.record.token_id: auth.signing_key(offer.record.token_id) for offer in offers})
        return plan
