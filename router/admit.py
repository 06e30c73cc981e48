"""Admission: whether a call may go on, decided before any instance is chosen for it: the caller's credential
and rate, its client's budget, the payload's size and schema; and the answer to a call turned away (nothing
forwarded). The caller's grants and trust level are router/auth.py's ``authorize``, asked wherever a call
reaches a capability (the one it names, a rule's, a fallback)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable

import msgspec
from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame, RouteFacts
from agent_reach.registration import Capability

from mesh.schemas import Validators
from router.auth import Caller, Refusal, Unauthenticated
from router.budgets import UNBOUNDED_WAIT_SECONDS, Budgets, Ticket
from router.call import CallResult, error_result
from router.mirror import RegistryMirror
from router.ratelimit import ClientLimits

log = logging.getLogger("agentreach.router")


class Admission:
    """The checks a call passes before its route is chosen; each refusal is counted in ``decisions``."""

    def __init__(self, mirror: RegistryMirror, client_limits: ClientLimits, budgets: Budgets, schemas: Validators,
                 decisions: Counter[str]):
        self.mirror = mirror
        self.client_limits = client_limits
        self.budgets = budgets
        self.schemas = schemas
        self.decisions = decisions

    def caller(self, caller: Caller | Unauthenticated, started: float) -> Refusal | None:
        """The auth step before anything else: a credential, then the client's rate."""
        if isinstance(caller, Unauthenticated):
            return Refusal(code=ErrorCode.UNAUTHENTICATED, message=caller.message, decision="unauthenticated")
        wait = self.client_limits.retry_after(caller.client_id, caller.rate_limit_qps, started)
        if wait is None:
            return None
        routers = len(self.mirror.routers)
        share = caller.rate_limit_qps * self.mirror.limit_share
        shared = f" ({routers} routers share it: this one admits {share:.3g}/s)" if routers > 1 else ""
        return Refusal(code=ErrorCode.BUSY, decision="rate_limited", retry_after=wait,
                       message=f"Client {caller.client_id} is over its {caller.rate_limit_qps:g} calls/s{shared}; "
                               f"retry in {wait} s")

    def reserve(self, client_id: str | None, frame: RequestFrame) -> Awaitable[Ticket | Refusal]:
        """The call's reservation in its client's budget lease, for a call the budgets apply to (``applies``),
        waiting at most the caller's timeout hint for a lease; the budgets' own coroutine, not another."""
        wait = min(frame.timeout_hint / 1000, UNBOUNDED_WAIT_SECONDS) if frame.timeout_hint is not None \
            else UNBOUNDED_WAIT_SECONDS
        return self.budgets.admit(client_id, frame.context, wait)

    def payload(self, frame: RequestFrame, capability: str, declared: Capability, size: int,
                started: float) -> CallResult | None:
        """The payload against what the capability it is routed to accepts: its size, then its input schema."""
        if size > declared.max_payload_bytes:
            return error_result(frame, ErrorCode.PAYLOAD_TOO_LARGE,
                                f"Payload is {size} bytes; {capability!r} accepts at most {declared.max_payload_bytes}",
                                RouteFacts(capability=capability, timeout_sla_ms=declared.timeout_sla_ms), started)
        if declared.input_schema is not msgspec.UNSET and (problem := self.schemas.problem(
                capability, declared.version, declared.input_schema, frame.payload)) is not None:
            return error_result(frame, ErrorCode.INVALID_PAYLOAD, problem.message, RouteFacts(capability=capability),
                                started, field=problem.field)
        return None

    def refuse(self, frame: RequestFrame, refusal: Refusal, caller: Caller | Unauthenticated | None,
               started: float) -> CallResult:
        """Answer a refused call with nothing forwarded; traced like any call, kept out of the reach
        ledger (any caller could invent capability names, and a refusal says nothing about health)."""
        self.decisions[refusal.decision] += 1
        client_id = caller.client_id if caller is not None else None
        # Over its rate or budget, a client may keep calling: one warning per call would flood the log.
        logger = log.info if refusal.code in (ErrorCode.BUSY, ErrorCode.BUDGET_EXHAUSTED) else log.warning
        logger("call refused", extra={"error_code": refusal.code.value, "client_id": client_id,
                                      "reason": refusal.message})
        result = error_result(frame, refusal.code, refusal.message, RouteFacts(capability=frame.capability), started,
                              ledgered=False)
        result.retry_after = refusal.retry_after
        if isinstance(result.frame, ErrorFrame):
            result.frame.reset_at = refusal.reset_at
        return result
