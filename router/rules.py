"""A capability's rule table, decided: which rule (if any) says where a call goes, and why.

Pure: (the call's context and version, its caller, the rules, the instances of each capability a rule
may name) -> Decision. Rules are tried by ascending priority; the first live rule whose ``match`` holds
and whose target has a healthy, available instance decides. A rule whose target has none is skipped
(and named in the reason) so the next one can serve. Shadow rules are evaluated by ``shadow_verdicts``
only, after the live decision, and never change it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from msgspec import UnsetType

from mesh.policy import WEEKDAYS, Hours, Rule, RuleTarget
from router.candidate import Candidate
from router.selection import HEALTHY, versions_filter

Action = Literal["route", "degrade", "refuse"]


class CallerFacts(msgspec.Struct, frozen=True):
    """What a rule may match of the caller (client and trust None with authentication off), and when the
    call came: UTC minutes since Monday 00:00 (None: no time window matches); how much of its budget this
    period is used (router/budgets.py; None: no budget, or no rule asks, so no budget rule matches)."""

    client_id: str | None = None
    trust_level: str | None = None
    minute_of_week: int | None = None
    budget_used: float | None = None


def minute_of_week(epoch_seconds: float) -> int:
    moment = time.gmtime(epoch_seconds)
    return moment.tm_wday * 1440 + moment.tm_hour * 60 + moment.tm_min


def _minutes(clock: str) -> int:
    return int(clock[:2]) * 60 + int(clock[3:])


def within(hours: Hours, at: int) -> bool:
    """Whether minute-of-week ``at`` falls in the window (a start after the end wraps past midnight)."""
    day, minute = divmod(at, 1440)
    if hours.days and WEEKDAYS[day] not in hours.days:
        return False
    start, end = _minutes(hours.start), _minutes(hours.end)
    return start <= minute < end if start < end else minute >= start or minute < end


class Decision(msgspec.Struct, frozen=True):
    """Where one call goes. ``rule`` None: no rule decided, the capability's policy routes as usual."""

    capability: str
    action: Action = "route"
    rule: str | None = None
    versions: tuple[str, ...] = ()  # constraints every candidate must satisfy (the frame's and the rule's)
    zone: str | None = None
    reason: str | None = None

    def same_target(self, other: Decision) -> bool:
        """Whether two decisions send a call to the same place (the rule that chose it aside)."""
        return (self.action, self.capability, self.versions, self.zone) == \
            (other.action, other.capability, other.versions, other.zone)


CandidatesOf = Callable[[str], list[Candidate]]
_ABSENT = object()


def matches(rule: Rule, context: dict[str, Any], caller: CallerFacts) -> bool:
    """Every condition the rule's ``match`` gives holds for this call."""
    when = rule.match
    if when.client is not None and when.client != caller.client_id:
        return False
    if when.trust_level is not None and when.trust_level != caller.trust_level:
        return False
    if when.hours is not None and (caller.minute_of_week is None or not within(when.hours, caller.minute_of_week)):
        return False
    if not isinstance(when.budget_used_above, UnsetType) and \
            (caller.budget_used is None or caller.budget_used <= when.budget_used_above):
        return False
    for key, value in when.context.items():  # a loop, not all(generator): this runs for every rule of every call
        got = context.get(key, _ABSENT)
        if got != value or type(got) is not type(value):
            return False
    return True


class RuleTable(msgspec.Struct, frozen=True):
    rules: list[Rule]  # by ascending priority
    has_shadow: bool
    uses_budget: bool  # some rule matches on budget use: only then is the caller's looked up


_TABLES: dict[int, tuple[list[Rule], RuleTable]] = {}
_TABLES_KEPT = 1024


def ordered(rules: list[Rule]) -> RuleTable:
    """A policy's rules in priority order, sorted once per stored policy rather than once per call: the
    cache holds the list it was built from, so a new list at a reused address is never mistaken for it."""
    cached = _TABLES.get(id(rules))
    if cached is not None and cached[0] is rules:
        return cached[1]
    if len(_TABLES) >= _TABLES_KEPT:
        _TABLES.clear()
    table = RuleTable(rules=sorted(rules, key=lambda rule: rule.priority),
                      has_shadow=any(rule.mode == "shadow" for rule in rules),
                      uses_budget=any(not isinstance(rule.match.budget_used_above, UnsetType) for rule in rules))
    _TABLES[id(rules)] = (rules, table)
    return table


def decide(rules: list[Rule], capability: str, context: dict[str, Any], frame_version: str | None,
           caller: CallerFacts, candidates_of: CandidatesOf, promoted: str | None = None) -> Decision:
    """The live decision for one call; ``rules`` in priority order (``ordered``). ``promoted``: a shadow
    rule's id to treat as live (where the call would have gone had it been)."""
    skipped: list[str] = []
    for rule in rules:
        if (rule.mode != "live" and rule.id != promoted) or not matches(rule, context, caller):
            continue
        decision = _decision(rule, capability, frame_version, caller, skipped)
        if decision.action == "refuse" or serviceable(decision, candidates_of):
            return decision
        skipped.append(rule.id)
    own = (frame_version,) if frame_version else ()
    reason = f"no rule decided ({_skipped(skipped)})" if skipped else None
    return Decision(capability=capability, versions=own, reason=reason)


def shadow_verdicts(rules: list[Rule], capability: str, context: dict[str, Any], frame_version: str | None,
                    caller: CallerFacts, candidates_of: CandidatesOf) -> list[tuple[str, Decision]]:
    """For every shadow rule the call matches, where the call would have gone had that rule been live."""
    return [(rule.id, decide(rules, capability, context, frame_version, caller, candidates_of, promoted=rule.id))
            for rule in rules if rule.mode == "shadow" and matches(rule, context, caller)]


def serviceable(decision: Decision, candidates_of: CandidatesOf) -> bool:
    """Whether the decision's target has an instance that is healthy, available and within its constraints."""
    pool = [candidate for candidate in candidates_of(decision.capability)
            if candidate.state == HEALTHY and candidate.available
            and (decision.zone is None or candidate.metadata.get("zone") == decision.zone)]
    return bool(versions_filter(pool, decision.versions) if decision.versions else pool)


def _decision(rule: Rule, capability: str, frame_version: str | None, caller: CallerFacts,
              skipped: list[str]) -> Decision:
    target: RuleTarget = rule.target
    elsewhere = target.capability is not None and target.capability != capability
    # The frame's constraint is on the capability it named: it does not bind another capability's versions.
    own = () if elsewhere or not frame_version else (frame_version,)
    versions = (*own, target.version) if target.version else own
    said = rule.reason or _explain(rule, caller)
    if rule.reason and (budget := _budget_condition(rule, caller)):
        said = f"{said} ({budget})"  # the operator's words cannot say this call's figure
    if skipped:
        said = f"{said} ({_skipped(skipped)})"
    return Decision(capability=target.capability or capability, action=rule.action, rule=rule.id,
                    versions=versions, zone=target.zone, reason=said)


def _budget_condition(rule: Rule, caller: CallerFacts) -> str | None:
    """How a rule matching on budget use matched this call (None: it does not match on it)."""
    above = rule.match.budget_used_above
    if isinstance(above, UnsetType) or caller.budget_used is None:
        return None
    return f"budget used {caller.budget_used:.2f} > {above:g}"


def _explain(rule: Rule, caller: CallerFacts) -> str:
    """A rule's reason when its author gave none: what it matched."""
    conditions = [f"context.{key}={value!r}" for key, value in rule.match.context.items()]
    if rule.match.client is not None:
        conditions.append(f"client={rule.match.client!r}")
    if rule.match.trust_level is not None:
        conditions.append(f"trust_level={rule.match.trust_level!r}")
    if (hours := rule.match.hours) is not None:
        days = f" on {','.join(hours.days)}" if hours.days else ""
        conditions.append(f"hours {hours.start}-{hours.end} UTC{days}")
    if budget := _budget_condition(rule, caller):
        conditions.append(budget)
    return f"rule {rule.id} (priority {rule.priority}) matched {' and '.join(conditions) or 'every call'}"


def _skipped(rule_ids: list[str]) -> str:
    return f"skipped {', '.join(rule_ids)}: no healthy instance in the target"
