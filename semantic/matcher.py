"""The semantic routing decision, pure: route only when the best is good enough AND clearly best.

A near miss (an intent for `order.query` sent to `order.qps`) does the wrong thing while looking
like success, so it is worse than a refusal. The router therefore routes only when the best score
clears a threshold and beats the runner-up by a margin; otherwise it refuses and shows the top
candidates with their scores, so a person or the caller can pick.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
from agent_reach.atp import ErrorCode, IntentCandidate

from semantic.outcome import IntentMatch, IntentRefusal


class MatchRule(msgspec.Struct, kw_only=True, frozen=True):
    threshold: float
    margin: float
    top_k: int = 3


def top_candidates(names: Sequence[str], scores: np.ndarray, k: int) -> list[IntentCandidate]:
    """The ``k`` best capabilities, best first (ties by name, so answers are stable)."""
    keep = np.argpartition(-scores, k - 1)[:k] if len(names) > k else np.arange(len(names))
    best = sorted(keep, key=lambda i: (-float(scores[i]), names[i]))
    return [IntentCandidate(names[i], round(float(scores[i]), 4)) for i in best]


def verdict(best: float, runner_up: float | None, rule: MatchRule) -> ErrorCode | None:
    """None to route to the best capability, else why not (scores as shown to the caller)."""
    if best < rule.threshold:
        return ErrorCode.INTENT_UNMATCHED
    if runner_up is not None and round(best - runner_up, 4) < rule.margin:
        return ErrorCode.INTENT_AMBIGUOUS
    return None


def decide(names: Sequence[str], scores: np.ndarray, rule: MatchRule) -> IntentMatch | IntentRefusal:
    """Route to the best capability, or refuse with the candidates when unsure."""
    candidates = top_candidates(names, scores, max(rule.top_k, 2))
    if not candidates:
        return IntentRefusal(code=ErrorCode.INTENT_UNMATCHED, candidates=[],
                             message="No capability has a description or examples to match an intent against")
    best, runner_up = candidates[0], (candidates[1] if len(candidates) > 1 else None)
    shown = candidates[:rule.top_k]
    code = verdict(best.score, runner_up.score if runner_up else None, rule)
    if code is None:
        return IntentMatch(capability=best.capability, score=best.score, candidates=shown)
    if code is ErrorCode.INTENT_UNMATCHED:
        message = (f"No capability matches the intent well enough: best is {best.capability!r} at "
                   f"{best.score:.3f}, below the threshold {rule.threshold:.3f}; name the capability or rephrase")
    else:
        assert runner_up is not None
        message = (f"The intent is ambiguous: {best.capability!r} ({best.score:.3f}) and {runner_up.capability!r} "
                   f"({runner_up.score:.3f}) are closer than the margin {rule.margin:.3f}; name the capability")
    return IntentRefusal(code=code, message=message, candidates=shown)


def asks_next(code: ErrorCode | None, candidates: int) -> bool:
    """Whether a cascade goes on to its next model after this verdict: only when nothing matched well enough
    among capabilities there were (a route stands, and so does a tie between two capabilities)."""
    return code is ErrorCode.INTENT_UNMATCHED and candidates > 0


def cascade_routed_to(steps: Sequence[tuple[Sequence[str], np.ndarray, MatchRule]]) -> str | None:
    """The capability a cascade sends an intent to, given each model's scores and rule in order, or None."""
    for names, scores, rule in steps:
        best = top_candidates(names, scores, 2)
        code = verdict(best[0].score, best[1].score if len(best) > 1 else None, rule) if best \
            else ErrorCode.INTENT_UNMATCHED
        if code is None:
            return best[0].capability
        if not asks_next(code, len(best)):
            return None
    return None


def routed_to(names: Sequence[str], scores: np.ndarray, rule: MatchRule) -> str | None:
    """The capability an intent with these scores is sent to, or None when it is refused."""
    best = top_candidates(names, scores, 2)
    if not best:
        return None
    return best[0].capability if verdict(best[0].score, best[1].score if len(best) > 1 else None, rule) is None \
        else None
