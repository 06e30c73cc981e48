"""The shapes of one routed call that the router's stages hand one another: what the caller is answered
(``CallResult``), what the attempts at a capability came to (``Attempts``) and what is known of the call
while it runs (``InFlight``). The stages are router/admit.py, decide.py, attempt.py and account.py;
router/core.py runs them in order."""

from __future__ import annotations

import time

import msgspec
from agent_reach.atp import BudgetRoute, ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, RouteFacts, error_frame
from agent_reach.registration import Capability, RoutingPolicy

from router.budgets import NO_TICKET, Ticket
from router.candidate import Score
from router.selection import RouteRefusal
from router.streaming import Relay
from router.tracecontext import CallSpan
from router.traces import AttemptTrace
from router.transports.answer import AgentAnswer

# What a caller is answered when the router itself fails mid-call (500, retryable): not the agent's doing.
ROUTER_FAILURE = ErrorCode.INTERNAL_ERROR


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


class Attempts(msgspec.Struct, kw_only=True):
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


class InFlight(msgspec.Struct, kw_only=True):
    """What the router knows of a call while it runs, held by ``Router.call``: a call cut short (an
    exception, cancellation) is still recorded with the instances it reached."""

    span: CallSpan
    tried: list[AttemptTrace] = []  # every attempt so far, fallback's included, in order
    relay: Relay = msgspec.field(default_factory=Relay)  # a streamed answer's chunks, to the caller if it streams
    budget: Ticket = NO_TICKET  # its reservation in its client's budget lease, its session (router/budgets.py)


def error_result(frame: RequestFrame, code: ErrorCode, message: str, route: RouteFacts, started: float, *,
                 ledgered: bool = True, field: str | None = None) -> CallResult:
    """The caller's error answer, ``route`` given the router's time so far."""
    route.overhead_ms = round((time.monotonic() - started) * 1000, 3)
    error = error_frame(frame.request_id, code, message, field)
    error.route = route
    return CallResult(frame=error, route=route, ledgered=ledgered)
