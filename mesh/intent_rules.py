"""Threshold and margin per embedding model, calibrated on an operator's labelled intents, as stored records.

Cosine scores mean different things under different models, so a rule belongs to a model: the
registry stores one per model name (``agentreach intents calibrate`` writes it), every router's
mirror holds them, and a router running that model routes with it, so all routers decide alike.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

INTENT_RULE_PREFIX = "intent-rules/"
# A count of intents: bounded, as every integer the registry stores is (its log encodes 64 bits at most).
Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)]


class LanguageReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the rule did on one language's held-out intents when it was fitted."""

    routable: Count
    correct: Count
    wrong: Count
    recall: float


class IntentRule(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One model's rule. A stored format (mesh/records.py): change only with a migration."""

    threshold: Annotated[float, msgspec.Meta(ge=-1.0, le=1.01)]
    margin: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
    # The vector size of the model it was fitted for: a router whose model of that name differs ignores it.
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=65_536)]
    # The threshold this much lower still routed no calibration intent wrongly.
    guard: float = 0.0
    intents: Count = 0
    calibrated_at: float = 0.0
    held_out: dict[str, LanguageReport] = {}
    # Languages (semantic/language.py) whose intents the model may not decide: calibration found it does not
    # read them (semantic/calibrate.py LanguageGate). A later stage of the cascade is skipped for them, leaving
    # the earlier stage's refusal; the first stage has none to leave and decides every language. Absent in
    # records stored before it: the model decides every language.
    off_languages: Annotated[list[Annotated[str, msgspec.Meta(max_length=16)]], msgspec.Meta(max_length=32)] = []


def intent_rule_key(model: str) -> str:
    return INTENT_RULE_PREFIX + model
