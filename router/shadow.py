"""Rule tables' record: how many calls each live rule decided and, for every call a shadow rule matches,
whether it would have sent the call where the live decision did: counts per rule and the last few
disagreements, so an operator promotes a rule with the evidence in hand (GET /rules/stats). Shadow
rules are judged after the live call is decided, off its path."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import msgspec

from mesh.policy import Rule
from router.rules import CallerFacts, CandidatesOf, Decision, shadow_verdicts

SAMPLES_KEPT = 5


class Disagreement(msgspec.Struct, kw_only=True):
    at: float  # unix seconds
    would: Decision
    did: Decision


class ShadowStats(msgspec.Struct, kw_only=True):
    capability: str
    rule: str
    agree: int = 0
    disagree: int = 0
    samples: list[Disagreement] = []  # the latest SAMPLES_KEPT, oldest first


class RuleHits(msgspec.Struct, kw_only=True):
    capability: str
    rule: str
    calls: int


class RuleBook:
    def __init__(self) -> None:
        self._stats: dict[tuple[str, str], ShadowStats] = {}
        self._hits: Counter[tuple[str, str]] = Counter()

    def hit(self, capability: str, rule: str) -> None:
        self._hits[(capability, rule)] += 1

    def hits(self, capability: str | None = None) -> list[RuleHits]:
        return [RuleHits(capability=name, rule=rule, calls=calls) for (name, rule), calls in sorted(self._hits.items())
                if capability is None or name == capability]

    def judge(self, rules: list[Rule], capability: str, context: dict[str, Any], frame_version: str | None,
              caller: CallerFacts, candidates_of: CandidatesOf, live: Decision) -> None:
        """Count one call against every shadow rule it matches."""
        for rule_id, would in shadow_verdicts(rules, capability, context, frame_version, caller, candidates_of):
            stats = self._stats.get((capability, rule_id))
            if stats is None:
                stats = self._stats[(capability, rule_id)] = ShadowStats(capability=capability, rule=rule_id)
            if would.same_target(live):
                stats.agree += 1
            else:
                stats.disagree += 1
                stats.samples.append(Disagreement(at=time.time(), would=would, did=live))
                del stats.samples[:-SAMPLES_KEPT]

    def shadows(self, capability: str | None = None) -> list[ShadowStats]:
        return [stats for (name, _), stats in sorted(self._stats.items())
                if capability is None or name == capability]
