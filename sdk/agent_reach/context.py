"""The call being served, kept in a contextvar so nested calls inherit its context.

A handler's outgoing calls carry the incoming session_id, user_id and trace_id, the token budget
minus what was already spent, the remaining deadline, and ``parent_request_id`` so the calls of one
user request form a tree. Nobody threads these through function arguments.
"""

from __future__ import annotations

import contextvars
import random
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import msgspec

from agent_reach import peer_json
from agent_reach.atp import new_request_id
from agent_reach.headers import CONTEXT_HEADER, TIMEOUT_HEADER, TRACEPARENT_HEADER
from agent_reach.usage import MAX_TOKENS, Usage, is_token_count

_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("agentreach_call", default=None)

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?P<trace>[0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


class CallContext:
    """What a handler knows about the call it serves (its ``ctx``); the SDK reads it back to answer."""

    __slots__ = (
        "capability",
        "context",
        "context_update",
        "deadline",
        "request_id",
        "tokens_reported",
        "tokens_spent",
        "usage",
    )

    def __init__(self, request_id: str, capability: str, context: dict[str, Any], deadline: float | None = None):
        self.request_id = request_id
        self.capability = capability
        self.context = context
        self.deadline = deadline
        self.tokens_reported = 0
        self.tokens_spent = 0
        self.usage: Usage | None = None  # what the handler reported: the answer's usage
        self.context_update: dict[str, Any] = {}

    @property
    def session_id(self) -> str | None:
        return self.context.get("session_id")

    @property
    def user_id(self) -> str | None:
        return self.context.get("user_id")

    @property
    def trace_id(self) -> str | None:
        return self.context.get("trace_id")

    @property
    def parent_request_id(self) -> str | None:
        return self.context.get("parent_request_id")

    @property
    def token_budget(self) -> int | None:
        """The budget left for this call: what the caller granted minus what was spent so far (no further below 0
        than a token count goes, so a nested call carries a budget the router takes)."""
        budget = self.context.get("token_budget")
        return None if budget is None else max(budget - self.tokens_spent, -MAX_TOKENS)

    def remaining(self) -> float | None:
        """Seconds until the caller stops waiting, or None without a deadline."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def report_usage(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Count tokens this handler consumed (once per model call, or once with the sums): the answer's
        ``usage`` carries them to the router, which prices them; heartbeats and the call's token budget
        see them too."""
        # The router drops a usage whose counts are not all token counts, and NaN in the heartbeat's counter
        # would have every later heartbeat refused: a count that is none fails here, in the handler.
        if not (is_token_count(input_tokens) and is_token_count(output_tokens)):
            raise ValueError(f"token counts are non-negative integers up to {MAX_TOKENS}: got {input_tokens!r}, "
                             f"{output_tokens!r}")
        so_far = self.usage or Usage()
        self.usage = Usage(input_tokens=so_far.input_tokens + input_tokens,
                           output_tokens=so_far.output_tokens + output_tokens)
        self.tokens_reported += input_tokens + output_tokens
        self.tokens_spent += input_tokens + output_tokens

    def report_tokens(self, n: int) -> None:
        """Tokens with no split between prompt and completion, reported as output tokens."""
        self.report_usage(output_tokens=n)

    def spent_by_callee(self, n: int) -> None:
        """Tokens a nested call reported; they use up this call's budget but are not this agent's."""
        self.tokens_spent += n

    def update_context(self, **fields: Any) -> None:
        """Fields to hand back as the response's context_update (and to pass on to nested calls)."""
        self.context_update.update(fields)


def current() -> CallContext | None:
    """The call being served in this task, if any."""
    return _current.get()


@contextmanager
def serving(call: CallContext) -> Iterator[CallContext]:
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


def new_trace_id() -> str:
    """A request id's form (the time, then 80 bits from the system's generator): a trace nobody can predict, so
    no caller can put its calls into another caller's trace (a span generator's outputs can be told in advance
    once enough of them are seen). Never all zero, which W3C forbids: the time leads."""
    return new_request_id()


def outgoing_context(explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The context for a call made now: inherited from the call being served, then ``explicit``."""
    context: dict[str, Any] = {}
    call = current()
    if call is not None:
        context.update(call.context)
        context.update(call.context_update)
        context["parent_request_id"] = call.request_id
        if call.token_budget is not None:
            context["token_budget"] = call.token_budget
    context.update(explicit or {})
    context.setdefault("trace_id", new_trace_id())
    return context


def remaining_budget(timeout: float | None) -> float | None:
    """The timeout for a call made now: never longer than the deadline of the call being served."""
    call = current()
    left = call.remaining() if call is not None else None
    if left is None:
        return timeout
    return max(left, 0.0) if timeout is None else max(min(timeout, left), 0.0)


def new_span_id() -> str:
    """64 random bits as 16 hex digits, never all zero (an all-zero span id is invalid in W3C). The module's
    generator is reseeded in a forked child, so two workers do not repeat each other's spans."""
    return f"{random.getrandbits(64) or 1:016x}"


def format_traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    """The W3C traceparent (version 00) of span ``span_id`` in trace ``trace_id``: the one builder, for the
    SDK's calls and the router's forwards alike."""
    return f"00-{trace_id}-{span_id}-{flags}"


def traceparent(trace_id: Any) -> str | None:
    """A W3C traceparent for a fresh span of ``trace_id``, when it is a W3C trace id."""
    if not isinstance(trace_id, str) or not _TRACE_ID.match(trace_id):
        return None
    return format_traceparent(trace_id, new_span_id())


def incoming_context(context: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The frame's context, with the trace id taken from ``traceparent`` when the frame lacks one."""
    if context.get("trace_id") is None:
        match = _TRACEPARENT.match(headers.get(TRACEPARENT_HEADER, ""))
        if match:
            context = {**context, "trace_id": match.group("trace")}
    return context


def rest_deadline(headers: Mapping[str, str]) -> float | None:
    """When the router stops waiting for a REST call (``X-Reach-Timeout-Ms``), on the monotonic clock."""
    try:
        return time.monotonic() + int(headers[TIMEOUT_HEADER]) / 1000
    except (KeyError, ValueError):
        return None


def rest_context(headers: Mapping[str, str]) -> dict[str, Any]:
    """The context a router sends a REST endpoint in ``X-Reach-Context``; empty if absent or bad."""
    try:
        context = peer_json.decode(headers.get(CONTEXT_HEADER, "{}"))
    except (msgspec.DecodeError, UnicodeEncodeError):  # aiohttp passes undecodable bytes as surrogates
        context = {}
    return incoming_context(context if isinstance(context, dict) else {}, headers)
