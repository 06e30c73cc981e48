"""One routed call, start to finish. ``Router.call`` runs the stages in order: admission
(router/admit.py), the choice of capability and instances (router/decide.py), the attempts with failover
(router/attempt.py) and, however the call ended, its accounting (router/account.py). Here: that order, what
the capability's breaker, version split, traffic mirror and fallback make of the attempts, and the answer,
with everything the caller needs to calibrate in RouteFacts.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

import msgspec
from agent_reach.atp import ErrorCode, RequestFrame, ResponseFrame, RouteFacts, error_frame
from agent_reach.registration import RoutingPolicy
from agent_reach.usage import priced

from mesh.alerts import AlertConfig
from mesh.policy import Policy
from mesh.schemas import Validators
from router.account import Accounting
from router.admit import Admission
from router.attempt import Failover
from router.audit import AuditLog
from router.auth import Caller, Refusal, Unauthenticated, authorize
from router.budgets import REPORT_SECONDS, UNBOUNDED_CALLS, Budgets
from router.call import ROUTER_FAILURE, Attempts, CallResult, InFlight, error_result
from router.decide import Choice
from router.degradation import DegradationAlerts
from router.forward import Forwarder
from router.instances import InstanceBook
from router.measurements import Measurements
from router.mirror import RegistryMirror
from router.outcome import Observer
from router.plan import CallPlan, CallPlans
from router.ratelimit import ClientLimits
from router.reach import ReachLedger
from router.rollback import Releases
from router.rules import Decision
from router.selection import RouteRefusal
from router.shadow import RuleBook
from router.sticky import StickyTable
from router.streaming import Relay
from router.tracecontext import ParentSpan, open_span
from router.traces import TraceStore
from router.traffic_mirror import TrafficMirror, mirrored, status_of
from router.transports.answer import AgentAnswer
from router.transports.base import DEFAULT_MAX_ANSWER_BYTES
from router.usage import UsageLedger
from semantic.confirmations import ANONYMOUS, ConfirmationQueue
from semantic.outcome import IntentMatch

if TYPE_CHECKING:
    from router.intents import SemanticRouter
    from router.otel import CallExport

log = logging.getLogger("agentreach.router")

_payload_encoder = msgspec.json.Encoder()
# Codes a caller caused: they say nothing about an instance's or capability's health.
CALLER_ERRORS = {ErrorCode.INVALID_FRAME, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.UNKNOWN_CAPABILITY,
                 ErrorCode.ROUTING_HINT_UNSATISFIABLE, ErrorCode.UNAUTHENTICATED, ErrorCode.FORBIDDEN,
                 ErrorCode.TRUST_LEVEL_INSUFFICIENT, ErrorCode.INTENT_AMBIGUOUS, ErrorCode.INTENT_UNMATCHED,
                 ErrorCode.INVALID_PAYLOAD, ErrorCode.VERSION_UNSATISFIABLE}


class RouterSettings(msgspec.Struct, kw_only=True, frozen=True):
    default_policy: RoutingPolicy = "least_load"
    panic_threshold: float = 0.5
    period_seconds: float = 60.0
    alert: AlertConfig = AlertConfig()
    # Plain successes traced per second at most (every other call always is); 0 traces them all.
    traced_successes_per_second: int = 1000
    # An agent's answer larger than this (decoded) is cut off while read: ANSWER_TOO_LARGE. One cap for
    # every capability, as large as the router's own request limit: answers often outgrow their payloads.
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    # Seconds between this router's reports of clients' budget spend to the registry (router/budgets.py).
    budget_report_seconds: float = REPORT_SECONDS
    # A budgeted client's calls declaring no bound (context.max_tokens / max_cost) in flight at once here: the
    # budget is passed by at most this many calls' usage per router (router/budgets.py).
    budget_unbounded_calls: int = UNBOUNDED_CALLS


class Router:
    def __init__(self, mirror: RegistryMirror, forwarder: Forwarder, settings: RouterSettings = RouterSettings(),
                 *, rng: random.Random | None = None, semantic: SemanticRouter | None = None):
        self.mirror = mirror
        self.settings = settings
        self.book = InstanceBook(self.limit_share)
        self.measurements = Measurements()
        self.observer = Observer(self.book, self.measurements)
        self.sticky = StickyTable()
        self.ledger = ReachLedger(period_seconds=settings.period_seconds, alert=settings.alert)
        self.decisions: Counter[str] = Counter()
        self.rules = RuleBook()
        self.releases = Releases()
        self.degradations = DegradationAlerts()
        self.traces = TraceStore(successes_per_second=settings.traced_successes_per_second)
        self.usage = UsageLedger()
        self.schemas = Validators()  # capabilities' input_schemas, compiled once per version
        # Set by the server when it can report confirmed intents to the registry.
        self.confirmations: ConfirmationQueue | None = None
        self.client_limits = ClientLimits(self.limit_share)
        # Client budgets spent from leases of the registry's account, and sessions' token caps.
        self.budgets = Budgets(mirror.router_id, lambda client_id: self.mirror.auth.clients.get(client_id),
                               report_every=settings.budget_report_seconds,
                               unbounded_calls=settings.budget_unbounded_calls)
        self._rng = rng or random.Random()
        self.plans = CallPlans(mirror, settings.default_policy)
        # The stages, in the order a call meets them; they share the parts above.
        self.admission = Admission(mirror, self.client_limits, self.budgets, self.schemas, self.decisions)
        self.choice = Choice(mirror, self.plans, self.book, self.measurements, self.budgets, self.rules, self.sticky,
                             self._rng, self.decisions, panic_threshold=settings.panic_threshold, semantic=semantic)
        self.failover = Failover(mirror, forwarder, self.book, self.observer, self.sticky, self.choice,
                                 self.decisions, max_answer_bytes=settings.max_answer_bytes)
        self.accounting = Accounting(mirror, self.budgets, self.traces, self.ledger, self.usage, self.degradations,
                                     self.decisions)
        self.traffic_mirror = TrafficMirror(self.failover.send_copy, self._rng)

    # The parts a server (or a test) may replace after construction, held by the stage that uses them.
    @property
    def semantic(self) -> SemanticRouter | None:
        return self.choice.semantic

    @semantic.setter
    def semantic(self, semantic: SemanticRouter | None) -> None:
        self.choice.semantic = semantic

    @property
    def forwarder(self) -> Forwarder:
        return self.failover.forwarder

    @forwarder.setter
    def forwarder(self, forwarder: Forwarder) -> None:
        self.failover.forwarder = forwarder

    @property
    def audit(self) -> AuditLog | None:
        """Set by the server when it keeps an audit trail: every call, refusals included, gets a row."""
        return self.accounting.audit

    @audit.setter
    def audit(self, audit: AuditLog | None) -> None:
        self.accounting.audit = audit

    @property
    def export(self) -> CallExport | None:
        """Set by the server when it exports traces over OTLP (--otlp-endpoint): every call's spans, as it ends."""
        return self.accounting.export

    @export.setter
    def export(self, export: CallExport | None) -> None:
        self.accounting.export = export

    def limit_share(self) -> float:
        """This router's fraction of every client rate and instance max_qps: 1 / live routers."""
        return self.mirror.limit_share

    async def call(self, frame: RequestFrame, caller: Caller | Unauthenticated | None = None,
                   parent: ParentSpan | None = None, relay: Relay | None = None) -> CallResult:
        """Route one call. ``caller`` is the resolved credential, None when authentication is off;
        ``parent`` the caller's W3C span, if it sent a valid one; ``relay`` carries a streaming caller's
        chunks (router/streaming.py).

        However the call ends (an answer, a refusal, a bug in the router, cancellation), it is traced
        and audited in ``finally``: an exception must not take a call out of the audit trail.
        """
        started, started_at = time.monotonic(), time.time()
        flight = InFlight(span=open_span(frame.context, parent), relay=relay or Relay())
        payload = _payload_encoder.encode(frame.payload)
        result: CallResult | None = None
        try:
            result = await self._route(frame, caller, started, flight, len(payload))
        except Exception:
            log.exception("call failed inside the router")
            result = error_result(frame, ROUTER_FAILURE, "The router failed while handling this call (the agent may "
                                  "have received it); the router's log has the cause",
                                  RouteFacts(capability=frame.capability), started, ledgered=bool(frame.capability))
        finally:
            self.accounting.account(frame, result, started, started_at, payload, caller, flight)
        return result

    async def _route(self, frame: RequestFrame, caller: Caller | Unauthenticated | None, started: float,
                     flight: InFlight, size: int) -> CallResult:
        """Admission around the choice of capability: the caller before any intent is matched, its grants and
        budget once the capability is known."""
        admission = self.admission
        if caller is not None:
            # Before semantic matching: an unknown caller must not spend the model's time.
            refusal = admission.caller(caller, started)
            if refusal is not None:
                return admission.refuse(frame, refusal, caller, started)
        match: IntentMatch | None = None
        if not frame.capability:  # a name always wins; only a frame without one is matched by meaning
            matched = await self.choice.intent(frame, started)
            if isinstance(matched, CallResult):
                return matched
            match = matched
        capability = frame.capability or ""
        plan = self.plans.of(capability)
        if isinstance(caller, Caller):
            refusal = authorize(caller, capability, plan)
            if refusal is not None:
                return admission.refuse(frame, refusal, caller, started)
        # Once the caller may make the call: a refused one must not take from its budget's lease.
        client_id = caller.client_id if isinstance(caller, Caller) else None
        if self.budgets.applies(client_id, frame.context):  # most calls: no budget, no coroutine
            admitted = await admission.reserve(client_id, frame)
            if isinstance(admitted, Refusal):
                return admission.refuse(frame, admitted, caller, started)
            flight.budget = admitted
        if frame.confirm_intent and frame.intent and plan is not None and self.confirmations is not None:
            # Only once the caller may call it: nobody teaches the mesh phrasings for capabilities it may not use.
            self.confirmations.offer(capability, frame.intent,
                                     caller.client_id if isinstance(caller, Caller) else ANONYMOUS)
        result = await self._call_capability(frame, capability, plan, started, size, caller, flight)
        if match is not None:
            result.route.match_score, result.route.intent_candidates = match.score, match.candidates
            result.route.intent_stages = match.stages
        return result

    async def _call_capability(self, frame: RequestFrame, capability: str, plan: CallPlan | None,
                               started: float, size: int, caller: Caller | Unauthenticated | None,
                               flight: InFlight) -> CallResult:
        if plan is None:
            policy = self.mirror.policy(capability)
            if policy is None:
                return error_result(frame, ErrorCode.UNKNOWN_CAPABILITY,
                                    f"No instance offers capability {capability!r}",
                                    RouteFacts(capability=capability), started)
            # The registry holds a policy for it, so the capability is known: its pool is empty.
            empty = Attempts(refusal=RouteRefusal(code=ErrorCode.NO_ROUTABLE_INSTANCE,
                                                  reason=f"no instance of {capability!r} is registered"))
            return await self._with_fallback(frame, policy, empty, started, caller, flight) or \
                self._finish(frame, capability, None, empty, started)
        policy = plan.policy
        # Built once per call and shared by the rules, the split and the attempt; None: neither is configured.
        candidates_of = self.choice.candidates_of(caller) \
            if policy.rule_list or policy.shares else None
        decision = self.choice.decision(frame, capability, policy, caller, candidates_of) \
            if candidates_of and policy.rule_list else \
            Decision(capability=capability, versions=(frame.version,) if frame.version else ())
        share = self.choice.share(frame, capability, policy, decision, candidates_of) \
            if candidates_of and policy.shares and not decision.rule else None
        if share is not None:
            total = sum(each.weight for each in policy.shares)
            decision = msgspec.structs.replace(decision, versions=(*decision.versions, share.version),
                                               reason=f"split: version {share.version} ({share.weight} of {total})")
        if decision.action == "refuse":
            return error_result(frame, ErrorCode.FORBIDDEN,
                                f"Refused by policy rule {decision.rule}: {decision.reason}",
                                RouteFacts(capability=capability, rule=decision.rule, reason=decision.reason), started,
                                ledgered=False)
        routed_plan = plan
        if decision.capability != capability:  # a rule sends it to another capability (it has a serving instance)
            routed_plan = self.plans.of(decision.capability) or plan
        routed, declared = routed_plan.capability, routed_plan.offers[0].capability
        refused = self.admission.payload(frame, routed, declared, size, started)
        if refused is not None:
            return refused
        now = time.monotonic()
        capability_breaker = self.book.breaker("", routed, routed_plan.policy.circuit_breaker)
        if capability_breaker.allow(now):
            sent = frame if routed == capability else msgspec.structs.replace(frame, capability=routed)
            attempts = await self.failover.run(sent, routed_plan, started, flight, decision,
                                               candidates_of(routed) if candidates_of else None)
            self.observer.observe_capability(capability_breaker, attempts.answer, time.monotonic())
        else:
            attempts = Attempts(answer=AgentAnswer(error_code=ErrorCode.CIRCUIT_OPEN, sent=False,
                                                   message=f"circuit open for capability {routed!r}"),
                                reason="capability_circuit_open")
        if decision.reason is not None:  # a rule or the split decided, or rules were skipped: route says which
            attempts.rule, attempts.reason = decision.rule, attempts.reason or decision.reason
            attempts.degraded = attempts.degraded or decision.action == "degrade"
        if share is not None and attempts.answer is not None:
            code = attempts.answer.error_code
            self.releases.record(capability, share.version, code is None or code in CALLER_ERRORS,
                                 (time.monotonic() - started) * 1000)
        mirror = policy.mirror_config
        if mirror is not None and routed == capability and \
                mirrored(mirror, capability, frame.request_id, declared.idempotent):
            live = attempts.refusal.code.value if attempts.refusal else status_of(attempts.answer)
            live_ms = (time.monotonic() - started) * 1000
            self.traffic_mirror.copy(frame, capability, plan.offers, mirror, live, live_ms)
        if attempts.answer is not None and attempts.answer.ok:  # the common case: no coroutine for fallback
            return self._finish(frame, routed, declared.timeout_sla_ms, attempts, started)
        fallback = await self._with_fallback(frame, policy, attempts, started, caller, flight)
        if fallback is not None:
            return fallback
        return self._finish(frame, routed, declared.timeout_sla_ms, attempts, started)

    async def _with_fallback(self, frame: RequestFrame, policy: Policy, attempts: Attempts, started: float,
                             caller: Caller | Unauthenticated | None, flight: InFlight) -> CallResult | None:
        """For a failed call, the fallback capability's success, else the policy's fixed answer (both degraded);
        None to answer the failure."""
        if self._beyond_fallback(attempts) or flight.relay.delivered:
            return None
        if policy.fallback_capability:
            fallback = await self._call_fallback(frame, policy.fallback_capability, started, caller, flight)
            if fallback is not None:
                return fallback
        floor = policy.degradation_config.answer
        if floor is None or policy.degradation_config.level == "L0":
            return None
        self.decisions["fixed_answer"] += 1
        answered = msgspec.structs.replace(attempts, answer=AgentAnswer(result=floor, sent=False), refusal=None,
                                           instance=None, version=None, served=None, degraded=True,
                                           reason="fixed_answer")
        return self._finish(frame, frame.capability or "", None, answered, started)

    async def _call_fallback(self, frame: RequestFrame, fallback: str, started: float,
                             caller: Caller | Unauthenticated | None, flight: InFlight) -> CallResult | None:
        plan = self.plans.of(fallback)
        if plan is None:
            return None
        if isinstance(caller, Caller) and authorize(caller, fallback, plan) is not None:
            # A fallback is not a way around grants or trust levels: answer the original failure.
            self.decisions["fallback_refused"] += 1
            return None
        attempts = await self.failover.run(msgspec.structs.replace(frame, capability=fallback), plan, started, flight)
        if attempts.answer is None or not attempts.answer.ok:
            return None
        attempts.degraded, attempts.reason = True, "fallback"
        self.decisions["fallback"] += 1
        return self._finish(frame, fallback, plan.offers[0].capability.timeout_sla_ms, attempts, started)

    def _beyond_fallback(self, attempts: Attempts) -> bool:
        """A failure another capability would not mend: the caller's, the agent's business answer, or the
        router's own (out of descriptors, a fallback fails alike)."""
        code = attempts.refusal.code if attempts.refusal else attempts.answer.error_code if attempts.answer else None
        return code in CALLER_ERRORS or code is ErrorCode.BUSINESS_ERROR or code is ErrorCode.INTERNAL_ERROR

    def _finish(self, frame: RequestFrame, capability: str, sla_ms: int | None, attempts: Attempts,
                started: float) -> CallResult:
        elapsed_ms = (time.monotonic() - started) * 1000
        route = RouteFacts(instance=attempts.instance, policy=attempts.policy, attempts=attempts.attempts,
                           degraded=attempts.degraded, timeout_sla_ms=sla_ms, capability=capability,
                           overhead_ms=round(max(0.0, elapsed_ms - attempts.agent_ms), 3), reason=attempts.reason,
                           rule=attempts.rule, version=attempts.version, budget=attempts.budget)
        if attempts.score is not None:
            route.score, route.score_parts, route.explored = \
                attempts.score.total, attempts.score.parts, attempts.score.explored
        if attempts.refusal is not None:
            return error_result(frame, attempts.refusal.code, attempts.refusal.reason, route, started)
        answer = attempts.answer
        assert answer is not None
        if answer.error_code is None:
            return CallResult(frame=ResponseFrame(request_id=frame.request_id, status="success", result=answer.result,
                                                  context_update=answer.context_update, route=route,
                                                  usage=answer.usage if attempts.served is None else
                                                  priced(attempts.served, answer.usage)),
                              route=route, plan=attempts.plan)
        error = error_frame(frame.request_id, answer.error_code, answer.message)
        error.business_error, error.route = answer.business_error, route
        return CallResult(frame=error, route=route, plan=attempts.plan)
