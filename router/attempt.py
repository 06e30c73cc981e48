"""Attempts: one call sent to the instances its plan names, one after another, until one answers or failing
over would not help; each answer handed to the outcome observer (router/outcome.py), which says what the
loop does next. Also the single send of a mirrored copy. The only I/O is the forward itself."""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict

import msgspec
from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.exhaustion import Throttle

from mesh.policy import DEFAULT_POLICY
from router.call import ROUTER_FAILURE, Attempts, InFlight
from router.candidate import Candidate
from router.decide import Choice
from router.forward import Forwarder
from router.instances import InstanceBook
from router.mirror import Offer, RegistryMirror
from router.outcome import Observer, Step, hurried
from router.plan import CallPlan, InstancePlan
from router.rules import Decision
from router.selection import RouteRefusal
from router.sticky import StickyTable, sticky_key
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts, resolve_timeouts
from router.tracecontext import CallSpan, open_span
from router.traces import AttemptTrace
from router.transports.answer import AgentAnswer

log = logging.getLogger("agentreach.router")

TIMEOUTS = {ErrorCode.CONNECT_TIMEOUT, ErrorCode.FIRST_BYTE_TIMEOUT, ErrorCode.TOTAL_TIMEOUT, ErrorCode.IDLE_TIMEOUT}
TIMED_OUT_REMEMBERED = 10_000


class Failover:
    """Sends calls to instances: the plan's order, the capability's retries, the breakers, the deadlines."""

    def __init__(self, mirror: RegistryMirror, forwarder: Forwarder, book: InstanceBook, observer: Observer,
                 sticky: StickyTable, choice: Choice, decisions: Counter[str], *, max_answer_bytes: int):
        self.mirror = mirror
        self.forwarder = forwarder
        self.book = book
        self.observer = observer
        self.sticky = sticky
        self.choice = choice
        self.decisions = decisions
        self.max_answer_bytes = max_answer_bytes
        self._timed_out: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        # Out of descriptors, every call fails alike: one log line per interval, not one per call.
        self._short_of_resources = Throttle()

    async def run(self, frame: RequestFrame, call_plan: CallPlan, started: float, flight: InFlight,
                  narrowed: Decision | None = None, candidates: list[Candidate] | None = None) -> Attempts:
        """``candidates``: the offers as this call's rules or split already saw them (built here when None)."""
        now = time.monotonic()
        choice = self.choice
        capability, policy, policy_name, instances = \
            call_plan.capability, call_plan.policy, call_plan.routing, call_plan.instances
        if candidates is None:
            candidates = [choice.candidate(instance, capability, policy, now) for instance in instances.values()]
        sticky = sticky_key(capability, frame.context, policy.affinity.key) if policy.affinity.enabled else None
        plan = choice.plan(frame, candidates, policy, policy_name, sticky, narrowed, now)
        if isinstance(plan, RouteRefusal):
            return Attempts(refusal=plan, policy=policy_name)
        first = instances[plan.order[0].agent_id]
        # The capability's own deadlines: a timeout the caller's hint brought forward is not the agent's.
        own = first.timeouts
        timeouts = own if frame.timeout_hint is None else \
            resolve_timeouts(policy.timeout, first.offer.capability.timeout_sla_ms, frame.timeout_hint)
        tries_allowed = policy.retry.max_attempts if policy.retry.enabled and first.offer.capability.idempotent else 1
        state = Attempts(policy=policy_name, degraded=plan.degraded, reason=plan.reason,
                         plan=[candidate.agent_id for candidate in plan.order], budget=plan.budget)
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
            instance = instances[candidate.agent_id]
            offer = instance.offer
            # Recorded before sending: a call cut short while the agent has it still names the agent.
            span = flight.span.child()
            attempt = AttemptTrace(
                instance=candidate.agent_id, endpoint=offer.capability.endpoint, protocol=offer.capability.protocol,
                started_ms=round((now - started) * 1000, 3), elapsed_ms=0.0, message="no answer: the call ended first",
                span_id=span.span_id)
            flight.tried.append(attempt)
            answer = await self._send(frame, capability, instance, timeouts, remaining, span, flight.relay)
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
            return Attempts(refusal=refusal, policy=policy_name, plan=state.plan, budget=plan.budget)
        return state

    async def _send(self, frame: RequestFrame, capability: str, instance: InstancePlan, timeouts: ResolvedTimeouts,
                    remaining: float, span: CallSpan, relay: Relay) -> AgentAnswer:
        offer = instance.offer
        agent_id = offer.record.agent_id
        attempt_timeouts = msgspec.structs.replace(
            timeouts, total_s=remaining, first_byte_s=min(timeouts.first_byte_s, remaining),
            connect_s=min(timeouts.connect_s, remaining))
        self.book.inflight[agent_id] = self.book.inflight.get(agent_id, 0) + 1
        try:
            sent = frame if frame.capability == capability else msgspec.structs.replace(frame, capability=capability)
            answer = await self.forwarder.send(offer.capability.endpoint, offer.capability.protocol, sent,
                                               attempt_timeouts, instance.signing_key, agent_id, self.max_answer_bytes,
                                               span=span, relay=relay)
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

    async def send_copy(self, frame: RequestFrame, offer: Offer) -> AgentAnswer:
        """A mirrored copy, sent once to one instance: none of a live call's failover or accounting."""
        policy = self.mirror.policy(frame.capability or "") or DEFAULT_POLICY
        timeouts = resolve_timeouts(policy.timeout, offer.capability.timeout_sla_ms, None)
        return await self.forwarder.send(offer.capability.endpoint, offer.capability.protocol, frame, timeouts,
                                         self.mirror.auth.signing_key(offer.record.token_id), offer.record.agent_id,
                                         self.max_answer_bytes, span=open_span(frame.context, None))

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
