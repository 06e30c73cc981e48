"""Accounting: what one ended call leaves behind, however it ended (an answer, a refusal, a failure of the
router's own, cancellation): its budget reservation settled, its trace (sampled under load) and audit row,
its count in the reach ledger, a degraded answer's alert, the tokens its client used."""

from __future__ import annotations

import hashlib
import time
from collections import Counter

from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, RouteFacts

from router.audit import AuditLog, call_entry
from router.auth import Caller, Unauthenticated
from router.budgets import NO_TICKET, Budgets
from router.call import CallResult, InFlight
from router.degradation import DegradationAlerts
from router.mirror import RegistryMirror
from router.otel import CallExport, ExportedCall, caller_sampled
from router.reach import Outcome, ReachLedger
from router.traces import CallTrace, TraceStore
from router.usage import UsageLedger
from semantic.confirmations import ANONYMOUS

# Not an ATP code (nothing is answered): what the trace and the audit row say of a cancelled call.
CANCELLED = "CANCELLED"


class Accounting:
    """Records ended calls; ``audit`` is set by the server when it keeps an audit trail (every call, refusals
    included, gets a row), ``export`` when it exports traces over OTLP (every call's spans, router/otel.py)."""

    def __init__(self, mirror: RegistryMirror, budgets: Budgets, traces: TraceStore, ledger: ReachLedger,
                 usage: UsageLedger, degradations: DegradationAlerts, decisions: Counter[str]):
        self.mirror = mirror
        self.budgets = budgets
        self.traces = traces
        self.ledger = ledger
        self.usage = usage
        self.degradations = degradations
        self.decisions = decisions
        self.audit: AuditLog | None = None
        self.export: CallExport | None = None

    def account(self, frame: RequestFrame, result: CallResult | None, started: float, started_at: float,
                payload: bytes, caller: Caller | Unauthenticated | None, flight: InFlight) -> None:
        """Trace, audit and count one call that ended; ``result`` is None when it was cancelled."""
        outcome = outcome_of(result) if result is not None else "failed"
        answered = result.frame if result is not None else None
        if flight.budget is not NO_TICKET:
            self.budgets.settle(flight.budget, answered.usage if isinstance(answered, ResponseFrame) else None)
        self._trace(frame, result, outcome, started, started_at, payload, caller, flight)
        if result is None or not result.ledgered:
            return
        code = result.frame.error_code if isinstance(result.frame, ErrorFrame) else None
        if code == ErrorCode.UNKNOWN_CAPABILITY:
            # Not a capability's call: counting it would let any caller invent metric labels.
            self.decisions["unknown_capability"] += 1
        else:
            self.ledger.record(frame.capability or "", outcome, code, (time.monotonic() - started) * 1000, time.time())
        if outcome == "degraded":
            self._degraded(frame, result.route)
        if isinstance(result.frame, ResponseFrame) and result.frame.usage is not None:
            self.usage.record(caller.client_id if isinstance(caller, Caller) else ANONYMOUS,
                              result.route.capability or "", result.route.instance or "", result.frame.usage,
                              time.time())

    def _degraded(self, frame: RequestFrame, route: RouteFacts) -> None:
        """An L1 capability's degraded answer is logged and alerted; an L2 one's is only counted."""
        policy = self.mirror.policy(frame.capability or "")
        if policy is not None and policy.degradation_config.level == "L1":
            self.degradations.degraded(frame.capability or "", route.reason, frame.request_id, time.time())

    def _trace(self, frame: RequestFrame, result: CallResult | None, outcome: Outcome, started: float,
               started_at: float, payload: bytes, caller: Caller | Unauthenticated | None,
               flight: InFlight) -> None:
        """Keep the call's trace (sampled under load, see TraceStore), and its audit row when an
        audit trail is kept (every call, refusals included); ``result`` None: the call was cancelled."""
        keep = self.traces.wants(outcome == "success", started_at)
        if not keep and self.audit is None and self.export is None:
            return
        route = result.route if result is not None else RouteFacts()
        answer = result.frame if result is not None else None
        parent_request_id = frame.context.get("parent_request_id")
        parent_request_id = parent_request_id if isinstance(parent_request_id, str) else None
        client_id = caller.client_id if caller is not None else None
        error_code = CANCELLED if answer is None else answer.error_code if isinstance(answer, ErrorFrame) else None
        total_ms = round((time.monotonic() - started) * 1000, 3)
        usage = answer.usage if isinstance(answer, ResponseFrame) else None
        relay = flight.relay
        capability, trace_id = frame.capability or "", str(frame.context["trace_id"])
        span = flight.span
        if keep:
            self.traces.add(CallTrace(
                request_id=frame.request_id, capability=capability, trace_id=trace_id,
                started_at=started_at, parent_request_id=parent_request_id, caller=client_id,
                payload_bytes=len(payload), timeout_hint=frame.timeout_hint,
                routing_hint=frame.context.get("routing_hint"), policy=route.policy,
                plan=result.plan if result is not None else [], degraded=route.degraded, reason=route.reason,
                rule=route.rule, version=route.version, score=route.score, score_parts=route.score_parts,
                explored=route.explored, budget=route.budget, intent_stages=route.intent_stages,
                attempts=flight.tried, outcome=outcome,
                error_code=error_code, total_ms=total_ms, overhead_ms=route.overhead_ms or 0.0, usage=usage,
                span_id=span.span_id, parent_span_id=span.parent_span_id, streamed=relay.streaming,
                chunks=relay.chunks, chunk_bytes=relay.bytes))
        if self.export is not None and caller_sampled(span):
            self.export.export(ExportedCall(
                frame.request_id, capability, started_at, total_ms, outcome, error_code, client_id, route.policy,
                route.degraded, route.reason, usage, flight.tried, span.trace_id, span.span_id, span.parent_span_id))
        if self.audit is not None:
            known = caller if isinstance(caller, Caller) else None
            self.audit.record(call_entry(
                started_at=started_at, capability=capability, request_id=frame.request_id, outcome=outcome,
                error_code=error_code, latency_ms=total_ms, caller_id=client_id,
                caller_name=known.name if known else None, auth_method=known.via if known else None,
                tried=flight.tried, trace_id=trace_id, parent_request_id=parent_request_id,
                payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest(), rule=route.rule,
                usage=usage, streamed=relay.streaming, chunks=relay.chunks, chunk_bytes=relay.bytes))


def outcome_of(result: CallResult) -> Outcome:
    if isinstance(result.frame, ErrorFrame):
        return "failed"
    return "degraded" if result.route.degraded else "success"
