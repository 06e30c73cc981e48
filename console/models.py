"""What the console's JSON API answers: one Struct per shape the front end reads.

Upstream shapes (AgentView, PeriodSummary, Alert, CallTrace) are the registry's and router's own
Structs, imported where they are decoded; these are the console's derived views on top of them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from registry.views import AgentView


class UpstreamStatus(msgspec.Struct, kw_only=True):
    """Whether the console could read a part of the mesh on its last poll."""

    ok: bool = False
    error: str | None = None
    checked_at: float | None = None


class ConsoleConfig(msgspec.Struct, kw_only=True):
    auth: str
    registry_url: str
    router_url: str
    poll_interval: float


class ReachPoint(msgspec.Struct, kw_only=True):
    """Every capability's calls in one router period, merged."""

    start: float
    end: float
    total: int
    success: int
    degraded: int
    failed: int
    raw_success_rate: float | None
    reach_rate: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None


class Overview(msgspec.Struct, kw_only=True):
    """The home page's four numbers and the last hour's reach curve, pushed every poll."""

    at: float
    registered_agents: int
    available_instances: int
    calls_per_second: float
    reach_rate: float | None
    raw_success_rate: float | None
    instance_health_rate: float | None
    window_seconds: int
    states: dict[str, int]
    active_alerts: int
    quality_alerts: int  # live instances below their capability's quality floor (the registry's GET /quality)
    curve: list[ReachPoint]
    registry: UpstreamStatus
    router: UpstreamStatus
    traces: UpstreamStatus


class TrafficStat(msgspec.Struct, kw_only=True):
    """One agent's attempts (optionally for one capability) over the console's live window."""

    calls: int = 0
    qps: float = 0.0
    errors: int = 0
    errors_by_code: dict[str, int] = {}
    tokens: int = 0
    cost: float = 0.0  # at the serving instances' prices (agent_reach.usage)
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None


class AgentRow(msgspec.Struct, kw_only=True):
    agent_id: str
    service: str
    state: str
    capabilities: list[str]
    heartbeat_age_ms: int | None
    load: float | None
    inflight: int | None
    zone: str | None
    model: str | None
    traffic: TrafficStat


class Beat(msgspec.Struct, kw_only=True):
    """One heartbeat the console noticed (its time is the registry's, rebuilt from its age)."""

    at: float
    load: float | None
    inflight: int | None
    state: str


class Transition(msgspec.Struct, kw_only=True):
    at: float
    previous: str | None
    state: str


class HourRow(msgspec.Struct, kw_only=True):
    """An hour of calls from the console's SQLite store (reach, an agent, or route decisions)."""

    hour: float
    total: int = 0
    success: int = 0
    degraded: int = 0
    failed: int = 0
    tokens: int = 0
    cost: float = 0.0
    reach_rate: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    decisions: dict[str, int] = {}


class AgentDetail(msgspec.Struct, kw_only=True):
    agent: AgentView
    heartbeats: list[Beat]
    transitions: list[Transition]
    traffic: TrafficStat
    capabilities: dict[str, TrafficStat]
    hours: list[HourRow]


class CapabilityReach(msgspec.Struct, kw_only=True):
    """One capability over the periods the router still holds (about the last hour)."""

    capability: str
    total: int
    success: int
    degraded: int
    failed: int
    failed_by_code: dict[str, int]
    raw_success_rate: float | None
    reach_rate: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    alert: str | None


class ReachView(msgspec.Struct, kw_only=True):
    period_seconds: float
    points: list[ReachPoint]
    capabilities: list[CapabilityReach]
    instance_health_rate: float | None
    hours: list[HourRow]


class RoutesView(msgspec.Struct, kw_only=True):
    decisions: dict[str, int]
    hours: list[HourRow]


class PolicyEntry(msgspec.Struct, kw_only=True):
    """A capability the mesh knows, its owning service and its policy (stored, or the default)."""

    capability: str
    service: str | None
    stored: bool
    policy: dict[str, Any]
    # The stored policy's ETag, for the editor to save only over the policy it opened (None: none stored).
    etag: str | None = None


class DebugResult(msgspec.Struct, kw_only=True):
    """What the router answered a frame sent from the debug entry, and how long it took."""

    http_status: int
    request_id: str | None
    elapsed_ms: float
    headers: dict[str, str]
    frame: Any
    trace_url: str | None
