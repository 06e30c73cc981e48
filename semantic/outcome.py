"""What semantic matching concludes for one intent; free of numpy so the router core can import it."""

from __future__ import annotations

import msgspec
from agent_reach.atp import ErrorCode, IntentCandidate, IntentStage


class IntentMatch(msgspec.Struct, kw_only=True, frozen=True):
    capability: str
    score: float
    candidates: list[IntentCandidate]
    # The models asked, in order; the last one decided.
    stages: list[IntentStage] = []


class IntentRefusal(msgspec.Struct, kw_only=True, frozen=True):
    code: ErrorCode
    message: str
    candidates: list[IntentCandidate]
    stages: list[IntentStage] = []
