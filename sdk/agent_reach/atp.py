"""The Agent Touch Protocol: request, response and error frames, and the error-code table.

This module is the single definition of the protocol; the registry, the router and the SDK
all import it, so a frame means the same thing on every hop.
"""

from __future__ import annotations

import os
import re
import time
from enum import StrEnum
from typing import Any, Literal

import msgspec

from agent_reach.registration import RoutingPolicy
from agent_reach.usage import MAX_COST, MAX_TOKENS, Usage

# A request id and a capability name travel in HTTP headers (X-Request-Id, X-Reach-Capability), so
# both are bounded and plain: visible ASCII, nothing a header could be split on. Checked by the
# router's edge with the functions below rather than as msgspec patterns, which cost every call ~2 µs.
MAX_REQUEST_ID_CHARS = 128
MAX_CAPABILITY_CHARS = 128
_CAPABILITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def new_request_id() -> str:
    """32 hex digits as a UUIDv7 lays them out: Unix milliseconds (48 bits), then 80 bits from the system's
    generator. Unpredictable still, and in time order, so the audit trail's request_id and trace_id indexes
    grow at their end rather than dirtying a page of their own for every row (decision 61)."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def valid_request_id(value: object) -> bool:
    """1 to 128 visible ASCII characters (0x21-0x7e; isprintable admits the space, so it is excluded)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_REQUEST_ID_CHARS and value.isascii() \
        and value.isprintable() and " " not in value


def valid_routing_hint(context: dict[str, Any]) -> bool:
    """``context.routing_hint`` absent, null or an object of labels. It is a hard filter, so a hint of any
    other shape is refused rather than ignored: ignoring it would route where the caller said not to."""
    hint = context.get("routing_hint")
    return hint is None or isinstance(hint, dict)


BUDGET_LABELS = ("economy", "standard", "premium")


def valid_budget(context: dict[str, Any]) -> bool:
    """``context.budget`` absent, null or one of BUDGET_LABELS: a label the router does not know is refused,
    not read as "standard", so a caller who misspelt "economy" is told rather than routed at any price."""
    budget = context.get("budget")
    return budget is None or budget in BUDGET_LABELS


def valid_token_budget(context: dict[str, Any]) -> bool:
    """``context.token_budget`` absent, null or a whole number of tokens (below 0: a nested call whose caller spent
    more than it had): a cap of another shape is refused, not ignored, which would leave the session uncapped."""
    budget = context.get("token_budget")
    return budget is None or (type(budget) is int and -MAX_TOKENS <= budget <= MAX_TOKENS)


def call_bound_problem(context: dict[str, Any]) -> str | None:
    """The field of ``context.max_tokens`` / ``context.max_cost`` (what a call declares it may use at most, which a
    budget reserves) that is not a whole number of tokens from 1 / a cost above 0; None when both are fine."""
    tokens = context.get("max_tokens")
    if tokens is not None and not (type(tokens) is int and 1 <= tokens <= MAX_TOKENS):
        return "context.max_tokens"
    cost = context.get("max_cost")
    if cost is not None and not (type(cost) in (int, float) and 0 < cost <= MAX_COST and cost == cost):
        return "context.max_cost"
    return None


def valid_capability(name: str) -> bool:
    """A capability name as the registry takes it: letters, digits and ``._:-``, up to 128, no newline."""
    return len(name) <= MAX_CAPABILITY_CHARS and _CAPABILITY.fullmatch(name) is not None


class RequestFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a caller sends: a capability (or, later, an intent) and its payload."""

    capability: str | None = None
    payload: Any = None
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    request_id: str = msgspec.field(default_factory=new_request_id)
    timeout_hint: int | None = None
    intent: str | None = None
    # With intent and capability: the caller says the intent meant that capability (after a refusal
    # listed it, say); routed as a named call, and the phrasing is kept as a learned example.
    confirm_intent: bool = False
    # A constraint on the capability's version (">=3.2", "^3", "~3.2", "3.2.1", ">=3,<4"): only
    # instances whose version satisfies it are candidates (agent_reach/versions.py has the grammar).
    version: str | None = None
    # Answer as server-sent events: chunks as the agent produces them, then the final frame (docs/atp.md).
    stream: bool = False


class BusinessError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An answer that is well-formed but useless to the caller; counts as a failure everywhere."""

    code: str
    message: str = ""
    details: Any = None


class IntentCandidate(msgspec.Struct, frozen=True):
    """A capability an intent might mean, with its similarity score."""

    capability: str
    score: float


class IntentStage(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What one embedding model of the router's cascade concluded about an intent; the last one asked decided.

    ``outcome``: routed, unmatched (best below ``threshold``) or ambiguous (best and runner-up closer
    than ``margin``); ``capability`` and ``score`` are its best, in that model's own scale. Skipped: its
    calibration found it does not read the intent's ``language``, so it was not asked and the earlier
    stage's refusal stands.
    """

    model: str
    outcome: Literal["routed", "unmatched", "ambiguous", "skipped"]
    capability: str | None = None
    score: float | None = None
    runner_up: float | None = None
    threshold: float
    margin: float
    language: str | None = None


class ScoreParts(msgspec.Struct, kw_only=True, frozen=True):
    """An instance's score under the scored policy, part by part, each 0 (best) to 1 (worst) against fixed
    bounds (docs/atp.md "Scored routing")."""

    latency: float
    errors: float
    load: float
    cost: float
    quality: float


# How a call was routed: its capability's policy, or "direct" when the router was unreachable and the
# SDK called an instance itself (agent_reach.direct).
RoutedBy = RoutingPolicy | Literal["direct"]


class BudgetRoute(msgspec.Struct, kw_only=True):
    """What the call's ``context.budget`` label did to the pool (docs/atp.md "Budget labels"): ``instances`` of
    the ``of`` eligible ones kept first; ``reference_price``, economy's, is the kept band's price for a reference
    call (None: no eligible instance declares a price, so the label kept them all)."""

    label: Literal["economy", "premium"]
    reference_price: float | None
    instances: int
    of: int


class RouteFacts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the mesh routed a call, so callers can calibrate their timeouts."""

    instance: str | None = None
    policy: RoutedBy | None = None
    attempts: int = 0
    degraded: bool = False
    timeout_sla_ms: int | None = None
    overhead_ms: float | None = None
    capability: str | None = None
    reason: str | None = None
    match_score: float | None = None
    intent_candidates: list[IntentCandidate] | None = None
    # Each model asked about the intent, in order: the last decided (semantic matching's cascade).
    intent_stages: list[IntentStage] | None = None
    # The policy rule that decided the call (absent: none matched) and the version of the instance that answered.
    rule: str | None = None
    version: str | None = None
    # Under the scored policy: the instance's score (0 best, 1 worst) and its parts, and whether it was an
    # exploration pick rather than the best score.
    score: float | None = None
    score_parts: ScoreParts | None = None
    explored: bool = False
    # With a budget label: what it did to the pool before the policy chose.
    budget: BudgetRoute | None = None


class ResponseFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What an agent answers when it handled the call; ``status`` is required, so always on the wire."""

    request_id: str
    status: Literal["success", "error", "busy"]
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: BusinessError | None = None
    route: RouteFacts | None = None
    # Tokens the call consumed: an agent reports them here; the router answers them with their cost.
    usage: Usage | None = None


class ErrorFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the mesh (or an agent) answers when the call did not succeed."""

    request_id: str
    error_code: ErrorCode
    error_message: str
    can_retry: bool
    business_error: BusinessError | None = None
    route: RouteFacts | None = None
    # The frame member at fault, when the caller's frame was refused (e.g. "request_id", "context").
    field: str | None = None
    # BUDGET_EXHAUSTED: when the client's budget resets (ISO 8601, UTC).
    reset_at: str | None = None


class ErrorCode(StrEnum):
    """Every error the mesh can answer, with its HTTP status and whether a retry may help. A StrEnum, so
    it reads as its code wherever it is written (f-strings, logs, metric labels, the audit table)."""

    INVALID_FRAME = "INVALID_FRAME"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    UNKNOWN_CAPABILITY = "UNKNOWN_CAPABILITY"
    NO_ROUTABLE_INSTANCE = "NO_ROUTABLE_INSTANCE"
    ROUTING_HINT_UNSATISFIABLE = "ROUTING_HINT_UNSATISFIABLE"
    CONNECT_TIMEOUT = "CONNECT_TIMEOUT"
    FIRST_BYTE_TIMEOUT = "FIRST_BYTE_TIMEOUT"
    TOTAL_TIMEOUT = "TOTAL_TIMEOUT"
    IDLE_TIMEOUT = "IDLE_TIMEOUT"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    BUSY = "BUSY"
    AGENT_ERROR = "AGENT_ERROR"
    ANSWER_TOO_LARGE = "ANSWER_TOO_LARGE"
    BUSINESS_ERROR = "BUSINESS_ERROR"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    TRUST_LEVEL_INSUFFICIENT = "TRUST_LEVEL_INSUFFICIENT"
    INTENT_AMBIGUOUS = "INTENT_AMBIGUOUS"
    INTENT_UNMATCHED = "INTENT_UNMATCHED"
    VERSION_UNSATISFIABLE = "VERSION_UNSATISFIABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"

    @property
    def http_status(self) -> int:
        return _ERROR_TABLE[self][0]

    @property
    def can_retry(self) -> bool:
        return _ERROR_TABLE[self][1]


_ERROR_TABLE: dict[ErrorCode, tuple[int, bool]] = {
    ErrorCode.INVALID_FRAME: (400, False),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, False),
    # The agent refused the request as wrong (HTTP 400/422, or its own INVALID_PAYLOAD frame): the
    # same request fails everywhere, so it is the caller's to fix, not a sign of the agent's health.
    ErrorCode.INVALID_PAYLOAD: (400, False),
    ErrorCode.UNKNOWN_CAPABILITY: (404, False),
    ErrorCode.NO_ROUTABLE_INSTANCE: (503, True),
    ErrorCode.ROUTING_HINT_UNSATISFIABLE: (503, False),
    ErrorCode.CONNECT_TIMEOUT: (504, True),
    ErrorCode.FIRST_BYTE_TIMEOUT: (504, True),
    ErrorCode.TOTAL_TIMEOUT: (504, True),
    # A streamed answer fell silent between chunks for longer than the capability's idle timeout.
    ErrorCode.IDLE_TIMEOUT: (504, True),
    ErrorCode.CIRCUIT_OPEN: (503, True),
    ErrorCode.BUSY: (429, True),
    ErrorCode.AGENT_ERROR: (502, True),
    # The same call would bring the same oversized answer: a retry cannot help.
    ErrorCode.ANSWER_TOO_LARGE: (502, False),
    ErrorCode.BUSINESS_ERROR: (422, False),
    ErrorCode.UNAUTHENTICATED: (401, False),
    ErrorCode.FORBIDDEN: (403, False),
    ErrorCode.TRUST_LEVEL_INSUFFICIENT: (403, False),
    # The frame is valid but its intent cannot be acted on safely; the same words get the same
    # answer, so a retry cannot help: the caller names the capability or rephrases.
    ErrorCode.INTENT_AMBIGUOUS: (422, False),
    ErrorCode.INTENT_UNMATCHED: (422, False),
    # No instance's capability version satisfies the frame's (or the deciding rule's) constraint: like a
    # routing hint, a hard filter; the call is never sent to another version.
    ErrorCode.VERSION_UNSATISFIABLE: (503, False),
    # The router failed itself (a bug, or out of file descriptors): nothing about the agent, so never
    # counted against one; the same call may well succeed a moment later, or through another router.
    ErrorCode.INTERNAL_ERROR: (500, True),
    # The caller's budget (its client's for the period, or its session's token_budget) is spent: retry once it
    # resets (the frame's reset_at, the Retry-After header); nothing was sent to an agent.
    ErrorCode.BUDGET_EXHAUSTED: (429, True),
}


# An agent's HTTP status saying the REQUEST was wrong (its content, size or headers), not the agent:
# the same request fails at every instance, so it is the caller's error, never counted against one.
_REQUEST_REFUSED = {400: ErrorCode.INVALID_PAYLOAD, 413: ErrorCode.PAYLOAD_TOO_LARGE, 414: ErrorCode.INVALID_FRAME,
                    422: ErrorCode.INVALID_PAYLOAD, 431: ErrorCode.INVALID_FRAME}


def agent_status_code(status: int) -> ErrorCode:
    """What an agent's HTTP status outside 2xx means when its body is no frame. One reading for the
    router's forward and the SDK's direct calls, so an answer is the same outcome by either path."""
    return ErrorCode.BUSY if status == 429 else _REQUEST_REFUSED.get(status, ErrorCode.AGENT_ERROR)


class _SentBusinessError(msgspec.Struct, kw_only=True):
    """A ``business_error`` object as agents send it: the code a string or a number, the message maybe null."""

    code: str | int | float
    message: str | None = None
    details: Any = None


# What an agent's business_error may be; anything else is a malformed answer (AGENT_ERROR) saying so.
BUSINESS_ERROR_SHAPE = "business_error must be a code (a string or a number) or an object with such a code"


def agent_business_error(raw: object) -> BusinessError | None:
    """An agent's ``business_error``: a code, or an object with a ``code`` (and ``message``, ``details``).
    A numeric code (``{"code": 5}``, common in agents) is kept as its JSON text (``"5"``), so the code is
    a string everywhere past the router. None when it is neither (a malformed answer, the agent's failure):
    a boolean or null code, a missing one, a message that is not a string."""
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        return BusinessError(code=_code_text(raw))
    try:
        sent = msgspec.convert(raw, _SentBusinessError)
    except msgspec.ValidationError:
        return None
    return BusinessError(code=_code_text(sent.code), message=sent.message or "", details=sent.details)


def _code_text(code: str | int | float) -> str:
    return code if isinstance(code, str) else msgspec.json.encode(code).decode()


def error_frame(request_id: str, code: ErrorCode, message: str, field: str | None = None) -> ErrorFrame:
    """Build an error frame whose can_retry always agrees with the table."""
    return ErrorFrame(
        request_id=request_id, error_code=code, error_message=message, can_retry=code.can_retry, field=field
    )
