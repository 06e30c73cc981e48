"""The routing policy of one capability: the schema the registry stores, the console edits and routers obey.

Decoding with msgspec checks types, ranges and unknown fields and names the offending path;
``validate_policy`` checks what a schema cannot (fields that must agree with each other or with
the capability the policy is stored under).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

import msgspec
from agent_reach.registration import Label, MetadataValue, Name, RoutingPolicy, TrustLevel

from mesh.versions import check_constraint

Milliseconds = Annotated[int, msgspec.Meta(gt=0, le=3_600_000)]
DEFAULT_CONNECT_MS = 1000


class StickyConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Sticky sessions: calls carrying the same ``context[key]`` return to the same instance."""

    enabled: bool = False
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "session_id"
    ttl_seconds: Annotated[int, msgspec.Meta(gt=0, le=86_400)] = 300


class TimeoutConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Per-call timeouts; ``None`` derives the value from the capability's ``timeout_sla_ms``."""

    connect_ms: Milliseconds = DEFAULT_CONNECT_MS
    first_byte_ms: Milliseconds | None = None
    total_ms: Milliseconds | None = None
    # A streamed answer's longest silence between chunks; None: router/timeouts.py's default.
    idle_ms: Milliseconds | None = None


class RetryConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Retries apply only to capabilities declared idempotent; off unless asked for."""

    enabled: bool = False
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=5)] = 2


class BreakerConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """When a circuit breaker opens, how long it stays open and how it tests recovery."""

    error_threshold_percent: Annotated[float, msgspec.Meta(gt=0, le=100)] = 50
    min_requests: Annotated[int, msgspec.Meta(ge=1)] = 20
    reset_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 30
    # Whole seconds: the breaker counts in 1 s buckets.
    window_seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 60
    half_open_probes: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1


Constraint = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
ContextKey = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class RuleMatch(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a call must carry for its rule to apply: every key given must hold (none given: every call)."""

    context: Annotated[dict[ContextKey, MetadataValue], msgspec.Meta(max_length=32)] = {}
    client: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    trust_level: TrustLevel | None = None


class RuleTarget(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where a matching call goes: another capability, a version range, a zone (unset: as without the rule)."""

    capability: Name | None = None
    version: Constraint | None = None
    zone: Label | None = None


class Rule(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One row of a capability's rule table; lower ``priority`` is tried first, the first live match decides.

    ``shadow`` rules never decide: the router records where they would have sent each call they match."""

    id: Name
    priority: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    mode: Literal["live", "shadow"] = "live"
    match: RuleMatch = RuleMatch()
    target: RuleTarget = RuleTarget()
    action: Literal["route", "degrade", "refuse"] = "route"
    # Why the rule exists, in the operator's words: the answer's route.reason when the rule decides.
    reason: Annotated[str, msgspec.Meta(max_length=200)] = ""


class Policy(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One capability's routing policy; ``policy=None`` defers to instance preference, then the default."""

    capability: Name | None = None
    policy: RoutingPolicy | None = None
    affinity: StickyConfig = StickyConfig()
    timeout: TimeoutConfig = TimeoutConfig()
    retry: RetryConfig = RetryConfig()
    circuit_breaker: BreakerConfig = BreakerConfig()
    fallback_capability: Name | None = None
    rules: Annotated[list[Rule], msgspec.Meta(max_length=64)] = []


DEFAULT_POLICY = Policy()


class PolicyError(ValueError):
    """A policy that decodes but contradicts itself; ``field`` is the dotted path to blame."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


def validate_policy(policy: Policy, capability_name: str) -> None:
    """Check the rules that span fields; raise PolicyError naming the first field that breaks one."""
    if policy.capability is not None and policy.capability != capability_name:
        raise PolicyError(
            f"Body names capability {policy.capability!r} but the path names {capability_name!r}", "capability"
        )
    if policy.fallback_capability == capability_name:
        raise PolicyError(f"Capability {capability_name!r} cannot be its own fallback", "fallback_capability")
    validate_rules(policy.rules)
    timeout = policy.timeout
    # The default connect_ms is not the user's word: it is capped by the others, never a conflict.
    connect_ms = None if timeout.connect_ms == DEFAULT_CONNECT_MS else timeout.connect_ms
    ordered = [("connect_ms", connect_ms), ("first_byte_ms", timeout.first_byte_ms),
               ("total_ms", timeout.total_ms)]
    given = [(name, value) for name, value in ordered if value is not None]
    for (shorter, short_ms), (longer, long_ms) in pairwise(given):
        if short_ms > long_ms:
            raise PolicyError(f"timeout.{shorter} ({short_ms}) exceeds timeout.{longer} ({long_ms})",
                              f"timeout.{shorter}")


def validate_rules(rules: list[Rule]) -> None:
    """One rule per priority (the order must be the operator's, never an accident of listing) and per id,
    version ranges some version satisfies, and a refusal that names no target."""
    priorities: dict[int, str] = {}
    ids: set[str] = set()
    for index, rule in enumerate(rules):
        at = f"rules[{index}]"
        if rule.priority in priorities:
            raise PolicyError(f"{at} ({rule.id!r}) has priority {rule.priority}, as {priorities[rule.priority]!r} "
                              "does: priorities decide the order, so each must be unique", f"{at}.priority")
        if rule.id in ids:
            raise PolicyError(f"{at}: rule id {rule.id!r} is used twice", f"{at}.id")
        priorities[rule.priority] = rule.id
        ids.add(rule.id)
        if rule.target.version is not None and (problem := check_constraint(rule.target.version)) is not None:
            raise PolicyError(f"{at}.target.version: {problem}", f"{at}.target.version")
        if rule.action == "refuse" and rule.target != RuleTarget():
            raise PolicyError(f"{at} refuses the call, so it cannot name a target", f"{at}.target")
