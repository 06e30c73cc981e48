"""Recent calls end to end, kept in memory, so one request_id can be followed as a tree.

Each routed call leaves a CallTrace: what came in, how the router decided, every attempt and
what the agent answered. Nested calls carry `parent_request_id` and the same `trace_id` in their
context, which is how a trace's calls assemble into a tree.

Request ids and trace ids are the caller's choice, so two callers may well use the same ones: each
call is kept under a key of the router's own, and a tree is assembled from parent links resolved
call by call (``parent_of``), never by merging every call that shares an id.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

import msgspec
from agent_reach.atp import BudgetRoute, ErrorCode, IntentStage, RoutedBy, ScoreParts
from agent_reach.registration import Protocol
from agent_reach.usage import Usage


class AttemptTrace(msgspec.Struct, kw_only=True, gc=False):
    instance: str
    endpoint: str
    protocol: Protocol
    started_ms: float  # since the call started
    elapsed_ms: float
    error_code: ErrorCode | None = None
    message: str = ""
    span_id: str = ""  # the attempt's W3C span, the parent the agent was sent in its traceparent


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
    policy: RoutedBy | None = None
    plan: list[str] = []
    degraded: bool = False
    reason: str | None = None
    rule: str | None = None  # the policy rule that decided (route.rule)
    version: str | None = None  # the answering instance's capability version (route.version)
    # Under the scored policy (route.score, score_parts, explored): the instance's score, its parts, an exploration.
    score: float | None = None
    score_parts: ScoreParts | None = None
    explored: bool = False
    budget: BudgetRoute | None = None  # what the call's budget label did to the pool (route.budget)
    # Matched by meaning: each embedding model asked, with its best and scores; the last decided.
    intent_stages: list[IntentStage] | None = None
    attempts: list[AttemptTrace] = []
    outcome: str = "pending"
    error_code: str | None = None  # an ErrorCode, or CANCELLED (nothing was answered)
    total_ms: float = 0.0
    overhead_ms: float = 0.0
    # The answer's tokens and their cost at the serving instance's prices (the caller's ``usage``); None: neither.
    usage: Usage | None = None
    span_id: str = ""  # the router's W3C span of this call
    parent_span_id: str | None = None  # the caller's span, from its traceparent
    # A streamed answer: whether the caller read it as a stream, its chunks and their bytes (JSON) together.
    streamed: bool = False
    chunks: int = 0
    chunk_bytes: int = 0


# Bounds on what callers' ids can make a tree cost: nesting deeper than any real call chain is cut,
# and a parent is looked for among the latest calls reusing its request_id only (else quadratic).
MAX_TREE_DEPTH = 64
MAX_NAMESAKES = 32


class TraceNode(msgspec.Struct, kw_only=True):
    call: CallTrace
    children: list[TraceNode] = []


def parent_of(call: CallTrace, named: Iterable[CallTrace]) -> CallTrace | None:
    """The call ``call`` names as its parent, among ``named``: the calls of its trace that carry the
    request_id it names as parent_request_id.

    A caller chooses its request ids, so several calls may carry the parent's: the same caller's is
    preferred, then the latest one that started before ``call``. A call of another caller can be a
    parent only if it was forwarded (an agent's nested call runs under the agent's own credentials),
    so nobody nests under a call that never reached an agent.
    """
    eligible = [m for m in named if m is not call and (m.caller == call.caller or m.attempts)]
    if not eligible:
        return None
    return max(eligible, key=lambda m: (m.caller == call.caller, m.started_at <= call.started_at, m.started_at))


class TraceStore:
    """The last ``max_calls`` calls, by request_id (the newest, when several share one), with their
    trace ids for tree assembly.

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
        self._keys = itertools.count()
        self._calls: OrderedDict[int, CallTrace] = OrderedDict()
        # Keys in the order the calls were added: the oldest, evicted first, is always leftmost.
        self._by_request: dict[str, deque[int]] = {}
        self._by_trace: dict[str, deque[int]] = {}

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
        key = next(self._keys)
        self._calls[key] = call
        self._by_request.setdefault(call.request_id, deque()).append(key)
        self._by_trace.setdefault(call.trace_id, deque()).append(key)
        while len(self._calls) > self.max_calls:
            _, old = self._calls.popitem(last=False)
            _forget_oldest(self._by_request, old.request_id)
            _forget_oldest(self._by_trace, old.trace_id)

    def get(self, request_id: str) -> CallTrace | None:
        """The newest call with this request_id."""
        keys = self._by_request.get(request_id)
        return self._calls[keys[-1]] if keys else None

    def recent(self, limit: int = 50, capability: str | None = None) -> list[CallTrace]:
        found = []
        for call in reversed(self._calls.values()):
            if capability is None or call.capability == capability:
                found.append(call)
                if len(found) >= limit:
                    break
        return found

    def tree(self, request_id: str) -> TraceNode | None:
        """The call tree that the newest call with ``request_id`` belongs to, rooted at its oldest
        known ancestor; calls that share its ids but not its parent links are not in it."""
        call = self.get(request_id)
        if call is None:
            return None
        by_request: dict[str, list[CallTrace]] = {}
        for key in self._by_trace[call.trace_id]:
            member = self._calls[key]
            by_request.setdefault(member.request_id, []).append(member)
        members = [member for named in by_request.values() for member in named]
        parents = {id(m): parent_of(m, by_request.get(m.parent_request_id or "", [])[-MAX_NAMESAKES:])
                   for m in members}
        children: dict[int, list[CallTrace]] = {}
        for member in members:
            parent = parents[id(member)]
            if parent is not None:
                children.setdefault(id(parent), []).append(member)
        root, climbed = call, {id(call)}
        while (parent := parents[id(root)]) is not None and id(parent) not in climbed and len(climbed) < MAX_TREE_DEPTH:
            root = parent
            climbed.add(id(root))

        def build(node: CallTrace, seen: frozenset[int]) -> TraceNode:
            if len(seen) >= MAX_TREE_DEPTH:
                return TraceNode(call=node)
            kids = [build(kid, seen | {id(kid)}) for kid in children.get(id(node), []) if id(kid) not in seen]
            return TraceNode(call=node, children=kids)

        return build(root, frozenset({id(root)}))


def _forget_oldest(index: dict[str, deque[int]], name: str) -> None:
    """Take the evicted call (the oldest under ``name``) out of an index, and the name with its last call."""
    keys = index[name]
    keys.popleft()
    if not keys:
        del index[name]
