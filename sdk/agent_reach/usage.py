"""A call's token usage and what it cost: what an agent reports, what the router charges for it.

An agent reports usage in its answer (a rest agent's top-level ``usage`` object, an ATP agent's response
frame); the router prices it from the serving instance's registration (``cost_per_call``,
``cost_per_1k_input_tokens``, ``cost_per_1k_output_tokens``, unit-free). A usage the router cannot read
is ignored, never a failed call: an agent's accounting mistake must not cost its caller the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

if TYPE_CHECKING:
    from agent_reach.registration import Capability

# Token counts past this are taken for garbage (and would lose exactness once summed as floats).
MAX_TOKENS = 2**53 - 1
# The largest cost a budget, a spend or a call's bound may be. Finite (1e999 reads as infinity): an infinite
# budget or spend would leave an account no arithmetic can use.
MAX_COST = 1e15
# The names an agent may use for each direction, its own first: OpenAI's are accepted too, as agents
# backed by a model often pass its usage through untouched.
_INPUT_NAMES = ("input_tokens", "prompt_tokens")
_OUTPUT_NAMES = ("output_tokens", "completion_tokens")


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """Tokens one call consumed; ``cost`` is the router's, from the serving instance's prices (None: it
    declares none)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None


def is_token_count(value: Any) -> bool:
    """A non-negative int (not a bool, a float, NaN) that sums exactly: what a usage's counts must be."""
    return type(value) is int and 0 <= value <= MAX_TOKENS


def _count(raw: dict[Any, Any], names: tuple[str, ...]) -> int | None:
    """The first of ``names`` present in ``raw``: 0 when none is, -1 when the one present is no token count."""
    for name in names:
        if name in raw:
            value = raw[name]
            return value if is_token_count(value) else -1
    return None


def usage_from(raw: Any) -> Usage | None:
    """The agent's ``usage`` object read as token counts; None when absent, empty or malformed (any count
    that is not a non-negative integer), so a garbled report is dropped whole rather than half-believed."""
    if not isinstance(raw, dict):
        return None
    given = _count(raw, _INPUT_NAMES), _count(raw, _OUTPUT_NAMES)
    if given == (None, None) or -1 in given:
        return None
    return Usage(input_tokens=given[0] or 0, output_tokens=given[1] or 0)


def call_cost(capability: Capability, usage: Usage | None) -> float | None:
    """What one call cost at ``capability``'s prices; None when it declares no price. A declared
    ``cost_per_call`` is due without token counts; token prices apply to the tokens reported (none: 0)."""
    per_call, per_input, per_output = (capability.cost_per_call, capability.cost_per_1k_input_tokens,
                                       capability.cost_per_1k_output_tokens)
    if per_call is UNSET and per_input is UNSET and per_output is UNSET:
        return None
    cost = 0.0 if per_call is UNSET else per_call
    if usage is not None:
        if per_input is not UNSET:
            cost += per_input * usage.input_tokens / 1000
        if per_output is not UNSET:
            cost += per_output * usage.output_tokens / 1000
    return cost


def priced(capability: Capability | None, usage: Usage | None) -> Usage | None:
    """The usage a caller is answered: the agent's counts with their cost; None when there is neither a
    usage nor a price (the common case, decided without building anything)."""
    if capability is None:
        return usage
    cost = call_cost(capability, usage)
    if cost is None:
        return usage
    return msgspec.structs.replace(usage or Usage(), cost=cost)
