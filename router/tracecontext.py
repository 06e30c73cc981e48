"""W3C Trace Context at the router: the caller's `traceparent` checked, and the router's own span.

A call that arrives with a valid `traceparent` continues the caller's trace: same trace-id, a new
span for the router (the caller's span becomes its parent), `tracestate` passed on unchanged. An
invalid header is ignored, as the W3C recommendation says: a caller's tracing mistake must never
fail its call. Pure functions; the API reads the headers and the forwarder writes them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec
from agent_reach.context import format_traceparent, new_span_id, new_trace_id
from agent_reach.headers import TRACEPARENT_HEADER, TRACESTATE_HEADER
from multidict import CIMultiDictProxy

# Version 00 only, lowercase hex (W3C Trace Context, level 1, section 3.2).
_TRACEPARENT = re.compile(r"00-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})-(?P<flags>[0-9a-f]{2})")
_HEX = re.compile(r"[0-9a-f]+")
# W3C asks to pass on at least 512 characters of tracestate; a longer one is dropped whole rather
# than cut (cutting could split a vendor's entry) so no caller makes every hop's headers grow.
MAX_TRACESTATE = 512
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class ParentSpan(msgspec.Struct, frozen=True, gc=False):
    """A caller's valid traceparent, with its tracestate when that is short enough to forward."""

    trace_id: str
    span_id: str
    flags: str
    tracestate: str | None = None


class CallSpan(msgspec.Struct, frozen=True, gc=False):
    """The router's span of one call: what the agent receives as traceparent and tracestate."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits, new for every call
    parent_span_id: str | None = None  # the caller's span, when it sent one of the same trace
    flags: str = "01"
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, self.flags)

    def child(self) -> CallSpan:
        """A span under this one, in the same trace: each attempt's, which is what its agent is sent."""
        return CallSpan(trace_id=self.trace_id, span_id=new_span_id(), parent_span_id=self.span_id,
                        flags=self.flags, tracestate=self.tracestate)


def parent_span(traceparent: str, tracestate: str) -> ParentSpan | None:
    """The caller's span from its headers (``tracestate`` its header lines joined by commas, "" when
    none), or None when the traceparent is not valid W3C."""
    match = _TRACEPARENT.fullmatch(traceparent.strip(" \t"))
    if match is None or match["trace"] == _ZERO_TRACE or match["span"] == _ZERO_SPAN:
        return None
    state: str | None = tracestate.strip(" \t")
    if not state or len(state) > MAX_TRACESTATE or not _TRACESTATE.fullmatch(state):
        state = None
    return ParentSpan(trace_id=match["trace"], span_id=match["span"], flags=match["flags"], tracestate=state)


def parent_of(headers: CIMultiDictProxy[str]) -> ParentSpan | None:
    """The caller's span from a request's ``traceparent`` / ``tracestate`` headers (None: none, or invalid)."""
    if TRACEPARENT_HEADER not in headers:
        return None
    return parent_span(headers[TRACEPARENT_HEADER], ",".join(headers.getall(TRACESTATE_HEADER, ())))


def w3c_id(text: str, size: int) -> str:
    """``text`` itself when it already is a W3C id of that size (its first ``size`` bytes when it is
    longer hex), else a stable digest of it: any trace_id a caller chose maps to one W3C trace."""
    plain = text.replace("-", "").lower()
    if len(plain) >= size * 2 and _HEX.fullmatch(plain) and plain[:size * 2].strip("0"):
        return plain[:size * 2]
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def open_span(context: dict[str, Any], parent: ParentSpan | None) -> CallSpan:
    """The router's span of a call, naming the call's trace in ``context`` when the caller did not.

    The trace is the frame's ``context.trace_id`` when it has one, else the caller's W3C trace, else
    a new random id: never the request_id, which a caller may choose and so share with another.
    The caller's span is the parent only when it belongs to the same trace.
    """
    trace = context.get("trace_id")
    if trace is None:
        # Already a W3C trace-id (the caller's, or a new one): no need to map it through w3c_id.
        trace_id = context["trace_id"] = parent.trace_id if parent is not None else new_trace_id()
    else:
        trace_id = w3c_id(str(trace), 16)
    if parent is None or parent.trace_id != trace_id:
        return CallSpan(trace_id=trace_id, span_id=new_span_id())
    return CallSpan(trace_id=trace_id, span_id=new_span_id(), parent_span_id=parent.span_id, flags=parent.flags,
                    tracestate=parent.tracestate)
