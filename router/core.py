"""One routed call, start to finish: find the capability, plan, attempt, fail over, account.

Decisions come from the pure modules (selection, breaker, policy); what each answer means for its
instance (breakers, ejection, reinstatement) and for the call's next step is the outcome observer's
(router/outcome.py). The only I/O here is the forward itself. Everything the caller needs to
calibrate is returned in RouteFacts.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec
from agent_reach.atp import BudgetRoute, ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, RouteFacts, error_frame
from agent_reach.exhaustion import Throttle
from agent_reach.registration import Capability, RoutingPolicy
from agent_reach.usage import priced

from mesh.alerts import AlertConfig
from mesh.policy import DEFAULT_POLICY, Policy, SplitShare
from mesh.schemas import Validators
from router.audit import AuditLog, call_entry
from router.auth import Caller, Refusal, Unauthenticated, authorize
from router.budgets import NO_TICKET, REPORT_SECONDS, UNBOUNDED_CALLS, UNBOUNDED_WAIT_SECONDS, Budgets, Ticket
from router.canary import assign, share_point
from router.candidate import Candidate, Score
from router.degradation import DegradationAlerts
from router.forward import Forwarder
from router.instances import InstanceBook
from router.measurements import Measurements
from router.mirror import Offer, RegistryMirror
from router.outcome import Observer, Step, hurried
from router.ratelimit import ClientLimits
from router.reach import Outcome, ReachLedger
from router.rollback import Releases
from router.rules import CallerFacts, CandidatesOf, Decision, decide, minute_of_week, ordered, serviceable
from router.scoring import InstanceScore, explain, reference_cost, scoring_of
from router.selection import RouteRefusal, choose_policy, plan_route, session_hash_key
from router.shadow import RuleBook
from router.sticky import StickyTable, sticky_key
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts, resolve_timeouts
from router.tracecontext import CallSpan, ParentSpan, open_span
from router.traces import AttemptTrace, CallTrace, TraceStore
from router.traffic_mirror import TrafficMirror, mirrored, status_of
from router.transports.answer import AgentAnswer
from router.transports.base import DEFAULT_MAX_ANSWER_BYTES
from router.usage import UsageLedger
from semantic.confirmations import ANONYMOUS, ConfirmationQueue
from semantic.outcome import IntentMatch, IntentRefusal

if TYPE_CHECKING:
    from router.intents import SemanticRouter

log = logging.getLogger("agentreach.router")

_payload_encoder = msgspec.json.Encoder()
# Codes a caller caused: they say nothing about an instance's or capability's health.
CALLER_ERRORS = {ErrorCode.INVALID_FRAME, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.UNKNOWN_CAPABILITY,
                 ErrorCode.ROUTING_HINT_UNSATISFIABLE, ErrorCode.UNAUTHENTICATED, ErrorCode.FORBIDDEN,
                 ErrorCode.TRUST_LEVEL_INSUFFICIENT, ErrorCode.INTENT_AMBIGUOUS, ErrorCode.INTENT_UNMATCHED,
                 ErrorCode.INVALID_PAYLOAD, ErrorCode.VERSION_UNSATISFIABLE}
TIMEOUTS = {ErrorCode.CONNECT_TIMEOUT, ErrorCode.FIRST_BYTE_TIMEOUT, ErrorCode.TOTAL_TIMEOUT, ErrorCode.IDLE_TIMEOUT}
TIMED_OUT_REMEMBERED = 10_000
# What a caller is answered when the router itself fails mid-call (500, retryable): not the agent's doing.
ROUTER_FAILURE = ErrorCode.INTERNAL_ERROR
# Not an ATP code (nothing is answered): what the trace and the audit row say of a cancelled call.
CANCELLED = "CANCELLED"


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


class CallResult(msgspec.Struct, kw_only=True):
    frame: ResponseFrame | ErrorFrame
    route: RouteFacts
    plan: list[str] = []
    # Seconds before a rate-limited caller may try again (the Retry-After header).
    retry_after: int | None = None
    # False when the call was turned away before a capability was reached (auth, rate, no capability
    # or intent): traced and audited, but kept out of the reach ledger.
    ledgered: bool = True

    @property
    def http_status(self) -> int:
        if isinstance(self.frame, ErrorFrame):
            return self.frame.error_code.http_status
        return 200


class _Attempts(msgspec.Struct, kw_only=True):
    answer: AgentAnswer | None = None
    refusal: RouteRefusal | None = None
    instance: str | None = None
    policy: RoutingPolicy | None = None
    attempts: int = 0
    degraded: bool = False
    reason: str | None = None
    agent_ms: float = 0.0
    plan: list[str] = []
    version: str | None = None  # the capability version of the instance last tried
    rule: str | None = None  # the policy rule that decided where the call went
    score: Score | None = None  # the scored policy's score of the instance last tried
    budget: BudgetRoute | None = None  # what the call's budget label did to the pool
    # The capability of the instance last tried when it declares prices (None: it declares none): they price the call.
    served: Capability | None = None


class _InFlight(msgspec.Struct, kw_only=True):
    """What the router knows of a call while it runs, held by ``Router.call``: a call cut short (an
    exception, cancellation) is still recorded with the instances it reached."""

    span: CallSpan
    tried: list[AttemptTrace] = []  # every attempt so far, fallback's included, in order
    relay: Relay = msgspec.field(default_factory=Relay)  # a streamed answer's chunks, to the caller if it streams
    budget: Ticket = NO_TICKET  # its reservation in its client's budget lease, its session (router/budgets.py)


class Router:
    def __init__(self, mirror: RegistryMirror, forwarder: Forwarder, settings: RouterSettings = RouterSettings(),
                 *, rng: random.Random | None = None, semantic: SemanticRouter | None = None):
        self.mirror = mirror
        self.semantic = semantic
        self.forwarder = forwarder
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
        # Set by the server when it keeps an audit trail: every call, refusals included, gets a row.
        self.audit: AuditLog | None = None
        # Set by the server when it can report confirmed intents to the registry.
        self.confirmations: ConfirmationQueue | None = None
        self.client_limits = ClientLimits(self.limit_share)
        # Client budgets spent from leases of the registry's account, and sessions' token caps.
        self.budgets = Budgets(mirror.router_id, lambda client_id: self.mirror.auth.clients.get(client_id),
                               report_every=settings.budget_report_seconds,
                               unbounded_calls=settings.budget_unbounded_calls)
        self._timed_out: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        # Out of descriptors, every call fails alike: one log line per interval, not one per call.
        self._short_of_resources = Throttle()
        self._rng = rng or random.Random()
        self.traffic_mirror = TrafficMirror(self._send_copy, self._rng)

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
        flight = _InFlight(span=open_span(frame.context, parent), relay=relay or Relay())
        payload = _payload_encoder.encode(frame.payload)
        result: CallResult | None = None
        try:
            result = await self._route(frame, caller, started, flight, len(payload))
        except Exception:
            log.exception("call failed inside the router")
            result = self._error(frame, ROUTER_FAILURE, "The router failed while handling this call (the agent may "
                                 "have received it); the router's log has the cause",
                                 RouteFacts(capability=frame.capability), started, ledgered=bool(frame.capability))
        finally:
            self._account(frame, result, started, started_at, payload, caller, flight)
        return result

    async def _route(self, frame: RequestFrame, caller: Caller | Unauthenticated | None, started: float,
                     flight: _InFlight, size: int) -> CallResult:
        if caller is not None:
            # Before semantic matching: an unknown caller must not spend the model's time.
            refusal = self._admit(caller, started)
            if refusal is not None:
                return self._refuse(frame, refusal, caller, started)
        match: IntentMatch | None = None
        if not frame.capability and self.semantic is None:
            return self._error(frame, ErrorCode.INVALID_FRAME,
                               "capability is required (semantic matching is off, so intent cannot stand for it)",
                               RouteFacts(), started, ledgered=False)
        if not frame.capability and frame.intent and self.semantic is not None:
            # A name always wins; only a frame without one is matched by meaning.
            resolved = await self.semantic.resolve(frame.intent)
            if isinstance(resolved, IntentRefusal):
                self.decisions[resolved.code.value.lower()] += 1
                return self._error(frame, resolved.code, resolved.message,
                                   RouteFacts(intent_candidates=resolved.candidates), started, ledgered=False)
            match = resolved
            self.decisions["semantic"] += 1
            frame.capability = match.capability  # in place: the trace and audit row name the matched capability
        capability = frame.capability or ""
        offers = self.mirror.offers(capability)
        if isinstance(caller, Caller):
            refusal = authorize(caller, capability, offers)
            if refusal is not None:
                return self._refuse(frame, refusal, caller, started)
        # Once the caller may make the call: a refused one must not take from its budget's lease.
        client_id = caller.client_id if isinstance(caller, Caller) else None
        if self.budgets.applies(client_id, frame.context):  # most calls: no budget, no coroutine
            wait = min(frame.timeout_hint / 1000, UNBOUNDED_WAIT_SECONDS) if frame.timeout_hint is not None \
                else UNBOUNDED_WAIT_SECONDS
            admitted = await self.budgets.admit(client_id, frame.context, wait)
            if isinstance(admitted, Refusal):
                return self._refuse(frame, admitted, caller, started)
            flight.budget = admitted
        if frame.confirm_intent and frame.intent and offers is not None and self.confirmations is not None:
            # Only once the caller may call it: nobody teaches the mesh phrasings for capabilities it may not use.
            self.confirmations.offer(capability, frame.intent,
                                     caller.client_id if isinstance(caller, Caller) else ANONYMOUS)
        result = await self._call_capability(frame, capability, offers, started, size, caller, flight)
        if match is not None:
            result.route.match_score, result.route.intent_candidates = match.score, match.candidates
        return result

    def _account(self, frame: RequestFrame, result: CallResult | None, started: float, started_at: float,
                 payload: bytes, caller: Caller | Unauthenticated | None, flight: _InFlight) -> None:
        """Trace, audit and count one call that ended; ``result`` is None when it was cancelled."""
        outcome = self._outcome(result) if result is not None else "failed"
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

    def _admit(self, caller: Caller | Unauthenticated, started: float) -> Refusal | None:
        """The auth step before anything else: a credential, then the client's rate."""
        if isinstance(caller, Unauthenticated):
            return Refusal(code=ErrorCode.UNAUTHENTICATED, message=caller.message, decision="unauthenticated")
        wait = self.client_limits.retry_after(caller.client_id, caller.rate_limit_qps, started)
        if wait is None:
            return None
        routers = len(self.mirror.routers)
        shared = f" ({routers} routers share it: this one admits {caller.rate_limit_qps * self.limit_share():.3g}/s)" \
            if routers > 1 else ""
        return Refusal(code=ErrorCode.BUSY, decision="rate_limited", retry_after=wait,
                       message=f"Client {caller.client_id} is over its {caller.rate_limit_qps:g} calls/s{shared}; "
                               f"retry in {wait} s")

    def _refuse(self, frame: RequestFrame, refusal: Refusal, caller: Caller | Unauthenticated | None,
                started: float) -> CallResult:
        """Answer a refused call with nothing forwarded; traced like any call, kept out of the reach
        ledger (any caller could invent capability names, and a refusal says nothing about health)."""
        self.decisions[refusal.decision] += 1
        client_id = caller.client_id if caller is not None else None
        # Over its rate or budget, a client may keep calling: one warning per call would flood the log.
        logger = log.info if refusal.code in (ErrorCode.BUSY, ErrorCode.BUDGET_EXHAUSTED) else log.warning
        logger("call refused", extra={"error_code": refusal.code.value, "client_id": client_id,
                                      "reason": refusal.message})
        result = self._error(frame, refusal.code, refusal.message, RouteFacts(capability=frame.capability), started,
                             ledgered=False)
        result.retry_after = refusal.retry_after
        if isinstance(result.frame, ErrorFrame):
            result.frame.reset_at = refusal.reset_at
        return result

    def _trace(self, frame: RequestFrame, result: CallResult | None, outcome: Outcome, started: float,
               started_at: float, payload: bytes, caller: Caller | Unauthenticated | None,
               flight: _InFlight) -> None:
        """Keep the call's trace (sampled under load, see TraceStore), and its audit row when an
        audit trail is kept (every call, refusals included); ``result`` None: the call was cancelled."""
        keep = self.traces.wants(outcome == "success", started_at)
        if not keep and self.audit is None:
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
        if keep:
            self.traces.add(CallTrace(
                request_id=frame.request_id, capability=capability, trace_id=trace_id,
                started_at=started_at, parent_request_id=parent_request_id, caller=client_id,
                payload_bytes=len(payload), timeout_hint=frame.timeout_hint,
                routing_hint=frame.context.get("routing_hint"), policy=route.policy,
                plan=result.plan if result is not None else [], degraded=route.degraded, reason=route.reason,
                rule=route.rule, version=route.version, score=route.score, score_parts=route.score_parts,
                explored=route.explored, budget=route.budget, attempts=flight.tried, outcome=outcome,
                error_code=error_code, total_ms=total_ms, overhead_ms=route.overhead_ms or 0.0, usage=usage,
                span_id=flight.span.span_id, parent_span_id=flight.span.parent_span_id, streamed=relay.streaming,
                chunks=relay.chunks, chunk_bytes=relay.bytes))
        if self.audit is not None:
            known = caller if isinstance(caller, Caller) else None
            self.audit.record(call_entry(
                started_at=started_at, capability=capability, request_id=frame.request_id, outcome=outcome,
                error_code=error_code, latency_ms=total_ms, caller_id=client_id,
                caller_name=known.name if known else None, auth_method=known.via if known else None,
                tried=flight.tried, trace_id=trace_id, parent_request_id=parent_request_id,
                payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest(), rule=route.rule,
                usage=usage, streamed=relay.streaming, chunks=relay.chunks, chunk_bytes=relay.bytes))

    async def _call_capability(self, frame: RequestFrame, capability: str, offers: list[Offer] | None,
                               started: float, size: int, caller: Caller | Unauthenticated | None,
                               flight: _InFlight) -> CallResult:
        if offers is None:
            policy = self.mirror.policy(capability)
            if policy is None:
                return self._error(frame, ErrorCode.UNKNOWN_CAPABILITY,
                                   f"No instance offers capability {capability!r}",
                                   RouteFacts(capability=capability), started)
            # The registry holds a policy for it, so the capability is known: its pool is empty.
            empty = _Attempts(refusal=RouteRefusal(code=ErrorCode.NO_ROUTABLE_INSTANCE,
                                                   reason=f"no instance of {capability!r} is registered"))
            return await self._with_fallback(frame, policy, empty, started, caller, flight) or \
                self._finish(frame, capability, None, empty, started)
        policy = self.mirror.policy(capability) or DEFAULT_POLICY
        # Built once per call and shared by the rules, the split and the attempt; None: neither is configured.
        candidates_of = self._candidates_of(capability, policy, caller) if policy.rule_list or policy.shares else None
        decision = self._decide(frame, capability, policy, caller, candidates_of) \
            if candidates_of and policy.rule_list else \
            Decision(capability=capability, versions=(frame.version,) if frame.version else ())
        share = self._share(frame, capability, policy, decision, candidates_of) \
            if candidates_of and policy.shares and not decision.rule else None
        if share is not None:
            total = sum(each.weight for each in policy.shares)
            decision = msgspec.structs.replace(decision, versions=(*decision.versions, share.version),
                                               reason=f"split: version {share.version} ({share.weight} of {total})")
        if decision.action == "refuse":
            return self._error(frame, ErrorCode.FORBIDDEN, f"Refused by policy rule {decision.rule}: {decision.reason}",
                               RouteFacts(capability=capability, rule=decision.rule, reason=decision.reason), started,
                               ledgered=False)
        routed, routed_policy = capability, policy
        if decision.capability != capability:  # a rule sends it to another capability (it has a serving instance)
            routed, offers = decision.capability, self.mirror.offers(decision.capability) or offers
            routed_policy = self.mirror.policy(routed) or DEFAULT_POLICY
        declared = offers[0].capability
        if size > declared.max_payload_bytes:
            return self._error(frame, ErrorCode.PAYLOAD_TOO_LARGE,
                               f"Payload is {size} bytes; {routed!r} accepts at most {declared.max_payload_bytes}",
                               RouteFacts(capability=routed, timeout_sla_ms=declared.timeout_sla_ms), started)
        if declared.input_schema is not msgspec.UNSET and (problem := self.schemas.problem(
                routed, declared.version, declared.input_schema, frame.payload)) is not None:
            return self._error(frame, ErrorCode.INVALID_PAYLOAD, problem.message, RouteFacts(capability=routed),
                               started, field=problem.field)
        now = time.monotonic()
        capability_breaker = self.book.breaker("", routed, routed_policy.circuit_breaker)
        if capability_breaker.allow(now):
            sent = frame if routed == capability else msgspec.structs.replace(frame, capability=routed)
            attempts = await self._attempt(sent, routed, offers, routed_policy, started, flight, decision,
                                           candidates_of(routed) if candidates_of else None)
            self.observer.observe_capability(capability_breaker, attempts.answer, time.monotonic())
        else:
            attempts = _Attempts(answer=AgentAnswer(error_code=ErrorCode.CIRCUIT_OPEN, sent=False,
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
            self.traffic_mirror.copy(frame, capability, offers, mirror, live, live_ms)
        if attempts.answer is not None and attempts.answer.ok:  # the common case: no coroutine for fallback
            return self._finish(frame, routed, declared.timeout_sla_ms, attempts, started)
        fallback = await self._with_fallback(frame, policy, attempts, started, caller, flight)
        if fallback is not None:
            return fallback
        return self._finish(frame, routed, declared.timeout_sla_ms, attempts, started)

    async def _send_copy(self, frame: RequestFrame, offer: Offer) -> AgentAnswer:
        """A mirrored copy, sent once to one instance: none of a live call's failover or accounting."""
        policy = self.mirror.policy(frame.capability or "") or DEFAULT_POLICY
        timeouts = resolve_timeouts(policy.timeout, offer.capability.timeout_sla_ms, None)
        return await self.forwarder.send(offer.capability.endpoint, offer.capability.protocol, frame, timeouts,
                                         self.mirror.auth.signing_key(offer.record.token_id), offer.record.agent_id,
                                         self.settings.max_answer_bytes, span=open_span(frame.context, None))

    def _candidates_of(self, capability: str, policy: Policy, caller: Caller | Unauthenticated | None) -> CandidatesOf:
        """The instances of a capability as rules, splits and the attempt see them during one call (built on first
        use, then kept); none when the caller may not call it."""
        now = time.monotonic()
        known: dict[str, list[Candidate]] = {}

        def candidates_of(name: str) -> list[Candidate]:
            found = known.get(name)
            if found is not None:
                return found
            offers = self.mirror.offers(name)
            if offers is None or (isinstance(caller, Caller) and authorize(caller, name, offers) is not None):
                found = []
            else:
                named_policy = policy if name == capability else self.mirror.policy(name) or DEFAULT_POLICY
                found = [self._candidate(offer, name, named_policy, now) for offer in offers]
            known[name] = found
            return found
        return candidates_of

    def _share(self, frame: RequestFrame, capability: str, policy: Policy, decision: Decision,
               candidates_of: CandidatesOf) -> SplitShare | None:
        """The split share this call's session belongs to; when that share has no instance to serve it, the
        heaviest share that has one (none has: the assigned share, whose refusal names the versions offered)."""
        index = assign(policy.shares, share_point(capability, session_hash_key(frame.context, frame.request_id)))
        if index is None:
            return None
        assigned = policy.shares[index]

        def serves(share: SplitShare) -> bool:
            return serviceable(msgspec.structs.replace(decision, versions=(*decision.versions, share.version)),
                               candidates_of)
        if serves(assigned):
            return assigned
        heaviest_first = sorted((share for share in policy.shares if share.weight), key=lambda share: -share.weight)
        return next((share for share in heaviest_first if serves(share)), assigned)

    def _decide(self, frame: RequestFrame, capability: str, policy: Policy, caller: Caller | Unauthenticated | None,
                candidates_of: CandidatesOf) -> Decision:
        """The rule table's decision for this call; shadow rules are judged once the call is answered."""
        table = ordered(policy.rule_list)
        rules = table.rules
        now = minute_of_week(time.time())
        # The budget's use is looked up only for a table that asks: other calls pay nothing for it.
        facts = CallerFacts(client_id=caller.client_id, trust_level=caller.trust_level, minute_of_week=now,
                            budget_used=self.budgets.used_fraction(caller.client_id) if table.uses_budget else None) \
            if isinstance(caller, Caller) else CallerFacts(minute_of_week=now)
        decision = decide(rules, capability, frame.context, frame.version, facts, candidates_of)
        self.decisions["rule" if decision.rule else "no_rule"] += 1
        if decision.rule is not None:
            self.rules.hit(capability, decision.rule)
        if table.has_shadow:
            # After this call's answer is on its way: shadow rules cost the live call nothing.
            asyncio.get_running_loop().call_soon(self.rules.judge, rules, capability, frame.context,
                                                 frame.version, facts, candidates_of, decision)
        return decision

    async def _with_fallback(self, frame: RequestFrame, policy: Policy, attempts: _Attempts, started: float,
                             caller: Caller | Unauthenticated | None, flight: _InFlight) -> CallResult | None:
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
                             caller: Caller | Unauthenticated | None, flight: _InFlight) -> CallResult | None:
        offers = self.mirror.offers(fallback)
        if offers is None:
            return None
        if isinstance(caller, Caller) and authorize(caller, fallback, offers) is not None:
            # A fallback is not a way around grants or trust levels: answer the original failure.
            self.decisions["fallback_refused"] += 1
            return None
        policy = self.mirror.policy(fallback) or DEFAULT_POLICY
        attempts = await self._attempt(msgspec.structs.replace(frame, capability=fallback), fallback, offers,
                                       policy, started, flight)
        if attempts.answer is None or not attempts.answer.ok:
            return None
        attempts.degraded, attempts.reason = True, "fallback"
        self.decisions["fallback"] += 1
        return self._finish(frame, fallback, offers[0].capability.timeout_sla_ms, attempts, started)

    async def _attempt(self, frame: RequestFrame, capability: str, offers: list[Offer], policy: Policy,
                       started: float, flight: _InFlight, narrowed: Decision | None = None,
                       candidates: list[Candidate] | None = None) -> _Attempts:
        """``candidates``: the offers as this call's rules or split already saw them (built here when None)."""
        now = time.monotonic()
        by_id = {offer.record.agent_id: offer for offer in offers}
        if candidates is None:
            candidates = [self._candidate(offer, capability, policy, now) for offer in offers]
        policy_name = choose_policy(policy.policy, [o.record.metadata.get("routing_policy") for o in offers],
                                    self.settings.default_policy)
        sticky = sticky_key(capability, frame.context, policy.affinity.key) if policy.affinity.enabled else None
        budget = frame.context.get("budget")
        plan = plan_route(candidates, policy_name=policy_name,
                          hash_key=session_hash_key(frame.context, frame.request_id),
                          # The hint is an object or None (checked at the edge); a rule's zone narrows it.
                          routing_hint=_with_zone(frame.context.get("routing_hint"), narrowed),
                          sticky_agent=self.sticky.get(sticky, now) if sticky else None,
                          rng=self._rng, panic_threshold=self.settings.panic_threshold,
                          versions=narrowed.versions if narrowed else (),
                          allow_degraded=policy.degradation_config.level != "L0",
                          scoring=scoring_of(policy, budget) if policy_name == "scored" else None,
                          quality_floor=policy.min_quality, budget=budget)
        if isinstance(plan, RouteRefusal):
            return _Attempts(refusal=plan, policy=policy_name)
        sla_ms = by_id[plan.order[0].agent_id].capability.timeout_sla_ms
        timeouts = resolve_timeouts(policy.timeout, sla_ms, frame.timeout_hint)
        # The capability's own deadlines: a timeout the caller's hint brought forward is not the agent's.
        own = resolve_timeouts(policy.timeout, sla_ms, None) if frame.timeout_hint is not None else timeouts
        idempotent = by_id[plan.order[0].agent_id].capability.idempotent
        tries_allowed = policy.retry.max_attempts if policy.retry.enabled and idempotent else 1
        state = _Attempts(policy=policy_name, degraded=plan.degraded, reason=plan.reason,
                          plan=[candidate.agent_id for candidate in plan.order], budget=plan.budget)
        self.decisions[policy_name] += 1
        if plan.reason is not None:
            self.decisions[plan.reason] += 1
        tries = 0
        broken = 0
        for candidate in plan.order:
            now = time.monotonic()
            remaining = timeouts.total_s - (now - started)
            if remaining <= 0:
                state.answer = state.answer or AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT, message="budget spent",
                                                           sent=False, cut_short=True)
                break
            breaker = self.book.breaker(capability, candidate.agent_id, policy.circuit_breaker)
            # Without a max_qps (0 or less: unlimited, the common case) an instance's bucket is not asked.
            if candidate.max_qps > 0 and not self.book.bucket(candidate.agent_id, candidate.max_qps).try_take(now):
                continue
            if not plan.panic and not breaker.allow(now):
                broken += 1
                continue
            if state.attempts:
                state.degraded, state.reason = True, "failover"
                self.decisions["failover"] += 1
            offer = by_id[candidate.agent_id]
            # Recorded before sending: a call cut short while the agent has it still names the agent.
            attempt = AttemptTrace(
                instance=candidate.agent_id, endpoint=offer.capability.endpoint, protocol=offer.capability.protocol,
                started_ms=round((now - started) * 1000, 3), elapsed_ms=0.0, message="no answer: the call ended first")
            flight.tried.append(attempt)
            answer = await self._send(frame, capability, offer, timeouts, remaining, flight.span, flight.relay)
            attempt.elapsed_ms, attempt.message = round(answer.elapsed_ms, 3), answer.message
            attempt.error_code = answer.error_code
            state.attempts += 1
            state.instance, state.version = candidate.agent_id, candidate.version
            state.served = offer.capability if candidate.cost is not None else None  # cost None: no price
            state.answer = answer
            state.agent_ms += answer.elapsed_ms
            answer.cut_short = hurried(answer.error_code, timeouts, own)
            step = self.observer.observe(breaker, candidate.agent_id, answer, time.monotonic(), capability)
            state.score = candidate.score
            if flight.relay.delivered:
                break  # the caller has chunks of this answer: another instance's would not continue them
            if step is Step.RETRY:
                tries += 1
                if tries < tries_allowed:
                    continue
            elif step is Step.NEXT:
                continue
            elif answer.ok and sticky:
                self.sticky.put(sticky, candidate.agent_id, policy.affinity.ttl_seconds, time.monotonic())
            break
        if state.answer is None:
            refusal = RouteRefusal(code=ErrorCode.CIRCUIT_OPEN, reason="every instance's circuit is open") if broken \
                else RouteRefusal(code=ErrorCode.BUSY, reason="every instance is at its max_qps")
            return _Attempts(refusal=refusal, policy=policy_name, plan=state.plan, budget=plan.budget)
        return state

    def scores(self, capability: str) -> tuple[RoutingPolicy, list[InstanceScore]] | None:
        """The policy ordering ``capability`` and every instance's score as the scored policy sees it now
        (None: no instance offers it)."""
        offers = self.mirror.offers(capability)
        if offers is None:
            return None
        policy = self.mirror.policy(capability) or DEFAULT_POLICY
        now = time.monotonic()
        candidates = [self._candidate(offer, capability, policy, now) for offer in offers]
        policy_name = choose_policy(policy.policy, [o.record.metadata.get("routing_policy") for o in offers],
                                    self.settings.default_policy)
        return policy_name, explain(candidates, policy.score_weights, policy.min_quality)

    def _candidate(self, offer: Offer, capability: str, policy: Policy, now: float) -> Candidate:
        agent_id = offer.record.agent_id
        max_qps = float(offer.record.metadata.get("max_qps") or 0)
        return Candidate(
            agent_id=agent_id, endpoint=offer.capability.endpoint, protocol=offer.capability.protocol,
            state=offer.state.state, load=offer.state.load, inflight=self.book.inflight.get(agent_id, 0),
            metadata=offer.record.metadata, max_qps=max_qps,
            available=self.book.available(capability, agent_id, policy.circuit_breaker, now),
            has_capacity=max_qps <= 0 or self.book.bucket(agent_id, max_qps).available(now) >= 1,
            version=offer.version, measured=self.measurements.get(capability, agent_id),
            cost=reference_cost(offer.capability), quality=self.mirror.quality(capability, agent_id),
            sla_ms=offer.capability.timeout_sla_ms,
        )

    async def _send(self, frame: RequestFrame, capability: str, offer: Offer, timeouts: ResolvedTimeouts,
                    remaining: float, span: CallSpan, relay: Relay) -> AgentAnswer:
        agent_id = offer.record.agent_id
        attempt_timeouts = msgspec.structs.replace(
            timeouts, total_s=remaining, first_byte_s=min(timeouts.first_byte_s, remaining),
            connect_s=min(timeouts.connect_s, remaining))
        self.book.inflight[agent_id] = self.book.inflight.get(agent_id, 0) + 1
        try:
            sent = frame if frame.capability == capability else msgspec.structs.replace(frame, capability=capability)
            answer = await self.forwarder.send(offer.capability.endpoint, offer.capability.protocol, sent,
                                               attempt_timeouts, self.mirror.auth.signing_key(offer.record.token_id),
                                               agent_id, self.settings.max_answer_bytes, span=span, relay=relay)
        finally:
            self.book.inflight[agent_id] -= 1
        if answer.error_code in TIMEOUTS:
            self._remember_timeout(frame.request_id, agent_id, capability, answer.error_code.value)
            log.warning("call timed out", extra={"instance": agent_id, "timeout": answer.error_code.value,
                                                 "elapsed_ms": round(answer.elapsed_ms, 1)})
        elif answer.error_code is ROUTER_FAILURE:
            self._short_of_resources.log(log, logging.ERROR, "router out of a system resource: calls fail "
                                         "without reaching any agent", instance=agent_id, error=answer.message)
        elif answer.error_code is not None:
            log.info("attempt failed", extra={"instance": agent_id, "error_code": answer.error_code.value,
                                              "error": answer.message})
        return answer

    def _remember_timeout(self, request_id: str, agent_id: str, capability: str, which: str) -> None:
        self._timed_out[request_id] = (agent_id, capability, which)
        while len(self._timed_out) > TIMED_OUT_REMEMBERED:
            self._timed_out.popitem(last=False)

    def late_completion(self, request_id: str, agent_id: str, finished_ms: float) -> bool:
        """An SDK agent says it finished a call the router had given up on."""
        known = self._timed_out.pop(request_id, None)
        if known is None:
            return False
        instance, capability, which = known
        log.warning("execution_success_but_response_timeout", extra={
            "request_id": request_id, "capability": capability, "instance": instance, "reporter": agent_id,
            "timeout": which, "finished_ms": finished_ms})
        return True

    def _beyond_fallback(self, attempts: _Attempts) -> bool:
        """A failure another capability would not mend: the caller's, the agent's business answer, or the
        router's own (out of descriptors, a fallback fails alike)."""
        code = attempts.refusal.code if attempts.refusal else attempts.answer.error_code if attempts.answer else None
        return code in CALLER_ERRORS or code is ErrorCode.BUSINESS_ERROR or code is ErrorCode.INTERNAL_ERROR

    def _finish(self, frame: RequestFrame, capability: str, sla_ms: int | None, attempts: _Attempts,
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
            return self._error(frame, attempts.refusal.code, attempts.refusal.reason, route, started)
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

    def _error(self, frame: RequestFrame, code: ErrorCode, message: str, route: RouteFacts,
               started: float, *, ledgered: bool = True, field: str | None = None) -> CallResult:
        route.overhead_ms = round((time.monotonic() - started) * 1000, 3)
        error = error_frame(frame.request_id, code, message, field)
        error.route = route
        return CallResult(frame=error, route=route, ledgered=ledgered)

    @staticmethod
    def _outcome(result: CallResult) -> Outcome:
        if isinstance(result.frame, ErrorFrame):
            return "failed"
        return "degraded" if result.route.degraded else "success"


def _with_zone(hint: dict[str, Any] | None, narrowed: Decision | None) -> dict[str, Any] | None:
    """The caller's routing hint narrowed to a rule's zone (a zone is a metadata label like any hint's)."""
    return hint if narrowed is None or narrowed.zone is None else {**(hint or {}), "zone": narrowed.zone}
