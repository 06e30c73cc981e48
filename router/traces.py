"""Recent calls end to end, kept in memory, so one request_id can be followed as a tree.

Each routed call leaves a CallTrace: what came in, how the router decided, every attempt and
what the agent answered. Nested calls carry `parent_request_id` and the same `trace_id` in their
context, which is how a trace's calls assemble into a tree.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec


class AttemptTrace(msgspec.Struct, kw_only=True, gc=False):
    instance: str
    endpoint: str
    protocol: str
    started_ms: float  # since the call started
    elapsed_ms: float
    error_code: str | None = None
    message: str = ""


class CallTrace(msgspec.Struct, kw_only=True, gc=False):
    request_id: str
    capability: str
    trace_id: str
    started_at: float  # wall clock seconds
    parent_request_id: str | None = None
    caller: str | None = None
    payload_bytes: int = 0
    timeout_hint: int | None = None
    routing_hint: dict[str, Any] | None = None
    policy: str | None = None
    plan: list[str] = []
    degraded: bool = False
    reason: str | None = None
    attempts: list[AttemptTrace] = []
    outcome: str = "pending"
    error_code: str | None = None
    total_ms: float = 0.0
    overhead_ms: float = 0.0
    tokens: int | None = None


class TraceNode(msgspec.Struct, kw_only=True):
    call: CallTrace
    children: list[TraceNode] = []


class TraceStore:
    """The last ``max_calls`` calls, by request_id, with their trace ids for tree assembly.

    Under load, plain successes are sampled: at most ``successes_per_second`` of them are kept
    each second (0: all), while every failed, degraded or refused call is. Keeping every call's
    trace cost a saturated router ~18 µs a call (measured), and the audit trail keeps every call
    durably anyway; what the traces are for — following a call, seeing what went wrong — survives.
    """

    def __init__(self, max_calls: int = 20_000, successes_per_second: int = 0):
        self.max_calls = max_calls
        self.successes_per_second = successes_per_second
        self.sampled_out = 0
        self._second = -1
        self._kept_this_second = 0
        self._calls: OrderedDict[str, CallTrace] = OrderedDict()
        self._by_trace: dict[str, list[str]] = {}

    def wants(self, plain_success: bool, now: float) -> bool:
        """Whether a call's trace is to be kept; ``now`` is wall-clock seconds."""
        if not plain_success or not self.successes_per_second:
            return True
        second = int(now)
        if second != self._second:
            self._second, self._kept_this_second = second, 0
        if self._kept_this_second < self.successes_per_second:
            self._kept_this_second += 1
            return True
        self.sampled_out += 1
        return False

    def add(self, call: CallTrace) -> None:
        self._calls[call.request_id] = call
        self._by_trace.setdefault(call.trace_id, []).append(call.request_id)
        while len(self._calls) > self.max_calls:
            _, old = self._calls.popitem(last=False)
            siblings = self._by_trace.get(old.trace_id, [])
            if old.request_id in siblings:
                siblings.remove(old.request_id)
            if not siblings:
                self._by_trace.pop(old.trace_id, None)

    def get(self, request_id: str) -> CallTrace | None:
        return self._calls.get(request_id)

    def recent(self, limit: int = 50, capability: str | None = None) -> list[CallTrace]:
        found = []
        for call in reversed(self._calls.values()):
            if capability is None or call.capability == capability:
                found.append(call)
                if len(found) >= limit:
                    break
        return found

    def tree(self, request_id: str) -> TraceNode | None:
        """The whole call tree that ``request_id`` belongs to, rooted at its oldest known ancestor."""
        call = self._calls.get(request_id)
        if call is None:
            return None
        members = [self._calls[rid] for rid in self._by_trace.get(call.trace_id, []) if rid in self._calls]
        ids = {member.request_id for member in members}
        children: dict[str | None, list[CallTrace]] = {}
        for member in members:
            parent = member.parent_request_id if member.parent_request_id in ids else None
            children.setdefault(parent, []).append(member)
        root, climbed = call, {call.request_id}
        while root.parent_request_id in ids and root.parent_request_id not in climbed:
            root = self._calls[root.parent_request_id]
            climbed.add(root.request_id)

        def build(node: CallTrace, seen: frozenset[str]) -> TraceNode:
            kids = [build(kid, seen | {kid.request_id}) for kid in children.get(node.request_id, [])
                    if kid.request_id not in seen]
            return TraceNode(call=node, children=kids)

        return build(root, frozenset({root.request_id}))
