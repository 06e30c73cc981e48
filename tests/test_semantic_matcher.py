"""The semantic routing decision, on hand-made vectors: threshold, margin, and what a refusal lists."""

from __future__ import annotations

import numpy as np
import pytest
from agent_reach.atp import ErrorCode, IntentCandidate

from semantic.embedder import unit_rows
from semantic.matcher import MatchRule, decide, verdict
from semantic.outcome import IntentMatch, IntentRefusal

RULE = MatchRule(threshold=0.6, margin=0.1, top_k=3)
NAMES = ["order.query", "order.qps", "invoice.create", "weather.forecast"]
# Four orthogonal capability directions: an intent's score for each is its coordinate on that axis.
CAPABILITIES = np.eye(4, dtype=np.float32)


def scores_for(*coordinates: float) -> np.ndarray:
    intent = unit_rows(np.array([coordinates], dtype=np.float32))[0]
    return CAPABILITIES @ intent


def test_routes_when_best_clears_threshold_and_margin() -> None:
    decision = decide(NAMES, scores_for(0.9, 0.3, 0.1, 0.0), RULE)
    assert isinstance(decision, IntentMatch)
    assert decision.capability == "order.query"
    assert decision.score == pytest.approx(0.9 / np.sqrt(0.91), abs=1e-4)
    assert [c.capability for c in decision.candidates] == ["order.query", "order.qps", "invoice.create"]


def test_near_miss_between_close_neighbours_is_ambiguous_not_routed() -> None:
    decision = decide(NAMES, scores_for(0.7, 0.65, 0.1, 0.0), RULE)
    assert isinstance(decision, IntentRefusal)
    assert decision.code is ErrorCode.INTENT_AMBIGUOUS
    assert [c.capability for c in decision.candidates] == ["order.query", "order.qps", "invoice.create"]
    assert "order.query" in decision.message and "order.qps" in decision.message


def test_weak_best_is_unmatched_and_lists_top_candidates_with_scores() -> None:
    scores = np.array([0.5, 0.2, 0.1, 0.05], dtype=np.float32)
    decision = decide(NAMES, scores, RULE)
    assert isinstance(decision, IntentRefusal)
    assert decision.code is ErrorCode.INTENT_UNMATCHED
    assert decision.candidates == [IntentCandidate("order.query", 0.5), IntentCandidate("order.qps", 0.2),
                                   IntentCandidate("invoice.create", 0.1)]


def test_threshold_and_margin_are_inclusive_at_the_shown_precision() -> None:
    assert verdict(0.6, 0.5, RULE) is None
    assert verdict(0.59, 0.4, RULE) is ErrorCode.INTENT_UNMATCHED
    assert verdict(0.65, 0.5501, RULE) is ErrorCode.INTENT_AMBIGUOUS
    assert verdict(0.59 + 0.1, 0.59, RULE) is None  # 0.69 - 0.59 is 0.0999999... in floats


def test_single_capability_needs_only_the_threshold() -> None:
    assert isinstance(decide(["weather.forecast"], np.array([0.8]), RULE), IntentMatch)


def test_no_described_capability_is_unmatched_with_no_candidates() -> None:
    decision = decide([], np.empty(0, dtype=np.float32), RULE)
    assert isinstance(decision, IntentRefusal)
    assert decision.code is ErrorCode.INTENT_UNMATCHED and decision.candidates == []


def test_ties_are_listed_by_name_so_answers_are_stable() -> None:
    decision = decide(["b.cap", "a.cap", "c.cap"], np.array([0.7, 0.7, 0.1]), RULE)
    assert isinstance(decision, IntentRefusal) and decision.code is ErrorCode.INTENT_AMBIGUOUS
    assert [c.capability for c in decision.candidates] == ["a.cap", "b.cap", "c.cap"]


def test_intent_error_codes_are_client_errors_that_retrying_cannot_fix() -> None:
    for code in (ErrorCode.INTENT_AMBIGUOUS, ErrorCode.INTENT_UNMATCHED):
        assert code.http_status == 422 and code.can_retry is False
