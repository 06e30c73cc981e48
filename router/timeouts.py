"""One call's timeouts, resolved from its capability's policy, its SLA and the caller's hint."""

from __future__ import annotations

import functools

import msgspec

from mesh.policy import TimeoutConfig

# A streamed answer may fall silent this long between chunks unless its policy says otherwise: long enough
# for a model's slowest token, short enough that a stalled stream ends well before most totals.
DEFAULT_IDLE_MS = 30_000


class ResolvedTimeouts(msgspec.Struct, kw_only=True, frozen=True):
    """The timeouts of one call, in seconds, ready for the HTTP client; ``idle_s`` bounds the silence
    between a streamed answer's chunks (the total still bounds the whole stream)."""

    connect_s: float
    first_byte_s: float
    total_s: float
    idle_s: float = DEFAULT_IDLE_MS / 1000


@functools.lru_cache(maxsize=4096)  # pure, and asked once or twice a call with the same policy and SLA
def resolve_timeouts(config: TimeoutConfig, timeout_sla_ms: int, timeout_hint_ms: int | None) -> ResolvedTimeouts:
    """Fill the gaps from the capability's SLA; the caller's hint may shorten the total, never lengthen it.

    A hint that is not positive is ignored (it cannot describe a call anyone waits for).
    """
    total_ms = config.total_ms if config.total_ms is not None else timeout_sla_ms
    if timeout_hint_ms is not None and timeout_hint_ms > 0:
        total_ms = min(total_ms, timeout_hint_ms)
    first_byte_ms = min(config.first_byte_ms if config.first_byte_ms is not None else total_ms, total_ms)
    connect_ms = min(config.connect_ms, first_byte_ms)
    idle_ms = config.idle_ms if isinstance(config.idle_ms, int) else DEFAULT_IDLE_MS
    return ResolvedTimeouts(connect_s=connect_ms / 1000, first_byte_s=first_byte_ms / 1000, total_s=total_ms / 1000,
                            idle_s=idle_ms / 1000)
