"""The routing policy of one capability: the schema the registry stores, the console edits and routers obey.

Decoding with msgspec checks types, ranges and unknown fields and names the offending path;
``validate_policy`` checks what a schema cannot (fields that must agree with each other or with
the capability the policy is stored under).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any, Literal

import msgspec
from agent_reach.registration import Label, MetadataValue, Name, RoutingPolicy, TrustLevel
from agent_reach.versions import check_constraint, overlap
from msgspec import UNSET, UnsetType

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
    # A streamed answer's longest silence between chunks; unset or None: router/timeouts.py's default.
    # Added after the stored layout was fixed: UNSET until given, so a policy that does not set it keeps
    # its stored bytes and older routers (which refuse unknown fields) can still read it.
    idle_ms: Milliseconds | UnsetType | None = UNSET


class RetryConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Retries apply only to capabilities declared idempotent; off unless asked for."""

    enabled: bool = False
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=5)] = 2


class BreakerConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """When a circuit breaker opens, how long it stays open and how it tests recovery."""

    error_threshold_percent: Annotated[float, msgspec.Meta(gt=0, le=100)] = 50
    min_requests: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] = 20
    reset_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 30
    # Whole seconds: the breaker counts in 1 s buckets.
    window_seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 60
    half_open_probes: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1


Constraint = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
ContextKey = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


ClockTime = Annotated[str, msgspec.Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Hours(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A time window in UTC: from ``start`` up to ``end`` ("HH:MM"; a start after the end wraps past
    midnight), on ``days`` (the day the call comes; none given: every day)."""

    start: ClockTime
    end: ClockTime
    days: Annotated[list[Weekday], msgspec.Meta(max_length=7)] = []


class RuleMatch(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a call must carry for its rule to apply: every key given must hold (none given: every call)."""

    context: Annotated[dict[ContextKey, MetadataValue], msgspec.Meta(max_length=32)] = {}
    client: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    trust_level: TrustLevel | None = None
    hours: Hours | None = None
    # The caller's budget this period used beyond this fraction (router/budgets.py ``used_fraction``): a caller
    # without a budget never matches. UNSET until given, like Policy's late fields: stored rules keep their bytes.
    budget_used_above: Annotated[float, msgspec.Meta(gt=0, le=1)] | UnsetType = UNSET


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


class SplitShare(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One version's share of the capability's calls; weights are proportional (Gateway API style)."""

    version: Constraint
    weight: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]


class RollbackConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """When a canary is worse than stable (the heaviest share) by more than ``worse_than_stable_by`` (error
    rate as a fraction, 0.05 = 5 points; or p99 in ms) over at least ``min_calls`` of each in the window,
    routers set its weight to 0 in the registry."""

    metric: Literal["error_rate", "p99_ms"] = "error_rate"
    worse_than_stable_by: Annotated[float, msgspec.Meta(gt=0)]
    min_calls: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 20
    window_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60


MAX_FLOOR_ANSWER_BYTES = 64 * 1024


class DegradationConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How far a failing capability may fall. L0: never (no fallback, no fixed answer, no pending or demoted
    instance: fail fast); L1: may degrade, each degraded answer logged and alerted; L2: may degrade freely.
    ``answer``: the last floor, answered as the result when everything else failed (null: none)."""

    level: Literal["L0", "L1", "L2"] = "L2"
    answer: Any = None


DEFAULT_DEGRADATION = DegradationConfig()

Weight = Annotated[float, msgspec.Meta(ge=0, le=1000)]


class ScoreWeights(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How much each part of an instance's score counts under the scored policy (router/scoring.py has the
    parts and their fixed bounds); only the ratios matter. By default a failure rate weighs twice latency;
    load a quarter of it, as the latency average already shows the queueing an instance's load causes (load
    adds what has not shown yet: calls in flight now, bench/scored_sim.py has the trade); and prices not at
    all: ``cost``, or ``cost_sensitivity`` s, brings them in. s is cost's share of the whole score, the other
    parts keeping their ratios (0.5: cost counts as much as everything else)."""

    latency: Weight = 1.0
    errors: Weight = 2.0
    load: Weight = 0.25
    cost: Weight = 0.0
    quality: Weight = 1.0
    cost_sensitivity: Annotated[float, msgspec.Meta(ge=0, le=0.9)] | None = None

    @property
    def whole(self) -> float:
        """Every weight together (``cost_sensitivity`` is no weight)."""
        return self.latency + self.errors + self.load + self.cost + self.quality

    def resolved(self) -> ScoreWeights:
        """The weights with ``cost_sensitivity`` turned into the cost weight."""
        if self.cost_sensitivity is None:
            return self
        others = self.whole - self.cost
        return msgspec.structs.replace(self, cost=others * self.cost_sensitivity / (1 - self.cost_sensitivity),
                                       cost_sensitivity=None)


DEFAULT_WEIGHTS = ScoreWeights()
DEFAULT_EXPLORE_SHARE = 0.05


class MirrorConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Copy ``percent`` of the calls to an instance of ``version``, compare, never answer with the copy.
    A capability not declared idempotent is mirrored only with ``allow_non_idempotent``: a copy does the work twice."""

    version: Constraint
    percent: Annotated[float, msgspec.Meta(gt=0, le=100)]
    allow_non_idempotent: bool = False


class Policy(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One capability's routing policy; ``policy=None`` defers to instance preference, then the default."""

    capability: Name | None = None
    policy: RoutingPolicy | None = None
    affinity: StickyConfig = StickyConfig()
    timeout: TimeoutConfig = TimeoutConfig()
    retry: RetryConfig = RetryConfig()
    circuit_breaker: BreakerConfig = BreakerConfig()
    fallback_capability: Name | None = None
    # Added after the stored layout was fixed (tests/test_mesh_contract.py): UNSET until given, and then
    # never encoded, so a policy that does not use them keeps its bytes and its feed line, and routers
    # that predate them still read it. Read them through the properties below.
    rules: Annotated[list[Rule], msgspec.Meta(max_length=64)] | UnsetType = UNSET
    split: Annotated[list[SplitShare], msgspec.Meta(max_length=16)] | UnsetType = UNSET
    rollback: RollbackConfig | UnsetType | None = UNSET
    degradation: DegradationConfig | UnsetType = UNSET
    mirror: MirrorConfig | UnsetType | None = UNSET
    # The scored policy (docs/atp.md "Scored routing"): its weights, the share of calls that explore, and the
    # posted quality below which an instance leaves rotation under any policy (unless none other is left).
    # 15 fields: a 16th would change every stored policy's bytes (msgpack's map header grows past 15 entries),
    # so a later field nests in an existing one.
    weights: ScoreWeights | UnsetType = UNSET
    explore_share: Annotated[float, msgspec.Meta(ge=0, le=0.5)] | UnsetType = UNSET
    quality_floor: Annotated[float, msgspec.Meta(ge=0, le=1)] | UnsetType = UNSET

    @property
    def rule_list(self) -> list[Rule]:
        return self.rules if not isinstance(self.rules, UnsetType) else []

    @property
    def shares(self) -> list[SplitShare]:
        return self.split if not isinstance(self.split, UnsetType) else []

    @property
    def rollback_config(self) -> RollbackConfig | None:
        return self.rollback if not isinstance(self.rollback, UnsetType) else None

    @property
    def degradation_config(self) -> DegradationConfig:
        return self.degradation if not isinstance(self.degradation, UnsetType) else DEFAULT_DEGRADATION

    @property
    def mirror_config(self) -> MirrorConfig | None:
        return self.mirror if not isinstance(self.mirror, UnsetType) else None

    @property
    def score_weights(self) -> ScoreWeights:
        """The weights as the scorer applies them (``cost_sensitivity`` resolved)."""
        return self.weights.resolved() if not isinstance(self.weights, UnsetType) else DEFAULT_WEIGHTS

    @property
    def exploration(self) -> float:
        return self.explore_share if not isinstance(self.explore_share, UnsetType) else DEFAULT_EXPLORE_SHARE

    @property
    def min_quality(self) -> float | None:
        """The quality floor; None: no floor."""
        return self.quality_floor if not isinstance(self.quality_floor, UnsetType) else None


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
    validate_rules(policy.rule_list)
    validate_split(policy.shares, policy.rollback_config)
    validate_degradation(policy)
    validate_weights(policy)
    mirror = policy.mirror_config
    if mirror is not None and (problem := check_constraint(mirror.version)) is not None:
        raise PolicyError(f"mirror.version: {problem}", "mirror.version")
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
        hours = rule.match.hours
        if hours is not None and hours.start == hours.end:
            raise PolicyError(f"{at}.match.hours starts and ends at {hours.start}: an empty window never matches",
                              f"{at}.match.hours.end")


def validate_split(split: list[SplitShare], rollback: RollbackConfig | None) -> None:
    """Readable, disjoint version ranges (a call's share must say which instances serve it) whose weights
    add up to more than 0; a rollback needs a canary beside stable to roll back."""
    for index, share in enumerate(split):
        at = f"split[{index}].version"
        if (problem := check_constraint(share.version)) is not None:
            raise PolicyError(f"{at}: {problem}", at)
        for earlier, other in enumerate(split[:index]):
            if overlap(share.version, other.version):
                raise PolicyError(f"{at} {share.version!r} overlaps split[{earlier}].version {other.version!r}: an "
                                  "instance would serve two shares", at)
    if split and sum(share.weight for share in split) == 0:
        raise PolicyError("split weights add up to 0: no version would take a call", "split")
    if rollback is not None and len(split) < 2:
        raise PolicyError("rollback needs a split with a canary beside the stable version", "rollback")


def validate_degradation(policy: Policy) -> None:
    """An L0 capability names no way to degrade; a fixed answer is bounded like any stored record."""
    degradation = policy.degradation_config
    if len(msgspec.json.encode(degradation.answer)) > MAX_FLOOR_ANSWER_BYTES:
        raise PolicyError(f"degradation.answer is over {MAX_FLOOR_ANSWER_BYTES} bytes as JSON", "degradation.answer")
    if degradation.level != "L0":
        return
    if policy.fallback_capability is not None:
        raise PolicyError("an L0 capability never degrades, so it cannot have a fallback_capability",
                          "fallback_capability")
    if degradation.answer is not None:
        raise PolicyError("an L0 capability never degrades, so it cannot have a fixed answer", "degradation.answer")
    for index, rule in enumerate(policy.rule_list):
        if rule.action == "degrade":
            raise PolicyError(f"rules[{index}] degrades, and an L0 capability never degrades", f"rules[{index}].action")


def validate_weights(policy: Policy) -> None:
    """Weights that tell instances apart, and one way of weighing cost, not two."""
    if isinstance(policy.weights, UnsetType):
        return
    weights = policy.weights
    if weights.resolved().whole == 0:
        raise PolicyError("weights add up to 0: every instance would score alike", "weights")
    if weights.cost and weights.cost_sensitivity is not None:
        raise PolicyError("weights.cost_sensitivity sets the cost weight: give it or weights.cost, not both",
                          "weights.cost_sensitivity")
