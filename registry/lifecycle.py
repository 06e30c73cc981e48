"""Lifecycle decisions as pure functions of soft state and the registry's own clock.

pending (registered, never heard from) -> healthy (heartbeats arriving) -> demoted (silent past
the silence timeout; still offered, last) -> evicted (N failed active checks while demoted).
A heartbeat or a passing check before eviction makes an instance healthy again.
"""

from __future__ import annotations

import math
from enum import StrEnum

import msgspec


class Status(StrEnum):
    PENDING = "pending"
    HEALTHY = "healthy"
    DEMOTED = "demoted"
    EVICTED = "evicted"


# Order in which /query offers instances: routable first, demoted after all of them.
QUERY_ORDER = {Status.HEALTHY: 0, Status.PENDING: 1, Status.DEMOTED: 2}


class LifecycleConfig(msgspec.Struct, kw_only=True, frozen=True):
    silence_timeout: float = 10.0
    health_interval: float = 3.0
    evict_after: int = 3
    # Eviction guard (Eureka's self-preservation): when more than this share of instances is
    # silent at once, the registry's own network is the likely fault, so nobody is evicted.
    guard_silent_fraction: float = 0.5
    guard_min_instances: int = 4
    # At most this share of live instances (and at least one) is evicted per sweep.
    evict_cap_fraction: float = 0.1
    # Deregistered agent_ids kept bound to their service (registry/bindings.py), newest first.
    kept_agent_ids: int = 10_000
    # Evicted records kept as history (registry/retention.py): the newest this many, for this long.
    kept_evicted: int = 1_000
    evicted_max_age: float = 24 * 3600.0


class Liveness(msgspec.Struct, kw_only=True, gc=False):
    """Soft state: memory only, never logged, rebuilt from heartbeats after a restart."""

    registered: float
    last_seen: float | None = None
    last_heartbeat: float | None = None
    failed_checks: int = 0
    load: float = 0.0
    inflight: int | None = None
    health: str | None = None
    metrics: dict[str, int | float] | None = None


def status_of(liveness: Liveness, evicted: bool, now: float, config: LifecycleConfig) -> Status:
    if evicted:
        return Status.EVICTED
    if liveness.last_seen is None:
        silent_for = now - liveness.registered
        return Status.PENDING if silent_for <= config.silence_timeout else Status.DEMOTED
    return Status.HEALTHY if now - liveness.last_seen <= config.silence_timeout else Status.DEMOTED


def record_heartbeat(liveness: Liveness, now: float) -> None:
    liveness.last_seen = liveness.last_heartbeat = now
    liveness.failed_checks = 0


def record_check(liveness: Liveness, passed: bool, now: float) -> None:
    if passed:
        liveness.last_seen = now
        liveness.failed_checks = 0
    else:
        liveness.failed_checks += 1


class EvictionPlan(msgspec.Struct, frozen=True):
    evict: list[str]
    guard_active: bool
    deferred: int


def plan_evictions(failing: list[str], live: int, silent: int, config: LifecycleConfig) -> EvictionPlan:
    """Which of the instances that failed enough checks to evict now.

    ``failing`` are the ids past ``evict_after`` failed checks, oldest failure first; ``live``
    counts instances not evicted, ``silent`` those of them that are demoted.
    """
    guard = live >= config.guard_min_instances and silent > live * config.guard_silent_fraction
    if guard:
        return EvictionPlan(evict=[], guard_active=True, deferred=len(failing))
    cap = max(1, math.floor(live * config.evict_cap_fraction))
    return EvictionPlan(evict=failing[:cap], guard_active=False, deferred=max(0, len(failing) - cap))
