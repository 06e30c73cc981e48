"""What the registry answers: JSON views of instances, built from records and soft state."""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.registration import Capability

from mesh.records import InstanceRecord
from registry.lifecycle import Liveness, Status


class AgentView(msgspec.Struct, kw_only=True):
    agent_id: str
    service: str
    state: Status
    capabilities: list[Capability]
    metadata: dict[str, Any]
    health_url: str
    base_url: str | None
    direct_fallback: bool
    registered_at: float
    evicted_at: float | None
    load: float | None
    inflight: int | None
    health: str | None
    metrics: dict[str, int | float] | None
    failed_checks: int
    last_heartbeat_ms_ago: int | None


class QueryInstance(msgspec.Struct, kw_only=True):
    agent_id: str
    state: Status
    endpoint: str
    protocol: str
    version: str
    timeout_sla_ms: int
    max_payload_bytes: int
    idempotent: bool
    trust_level: str | None
    load: float
    inflight: int | None
    health: str | None
    metadata: dict[str, Any]
    direct_fallback: bool
    last_heartbeat_ms_ago: int | None


class QueryResult(msgspec.Struct, kw_only=True):
    capability: str
    service: str
    instances: list[QueryInstance]


def _ms_since(moment: float | None, now: float) -> int | None:
    return None if moment is None else int((now - moment) * 1000)


def agent_view(record: InstanceRecord, liveness: Liveness | None, state: Status, now: float) -> AgentView:
    return AgentView(
        agent_id=record.agent_id,
        service=record.service,
        state=state,
        capabilities=record.capabilities,
        metadata=record.metadata,
        health_url=record.health_url,
        base_url=record.base_url,
        direct_fallback=record.direct_fallback,
        registered_at=record.registered_at,
        evicted_at=record.evicted_at,
        load=liveness.load if liveness else None,
        inflight=liveness.inflight if liveness else None,
        health=liveness.health if liveness else None,
        metrics=liveness.metrics if liveness else None,
        failed_checks=liveness.failed_checks if liveness else 0,
        last_heartbeat_ms_ago=_ms_since(liveness.last_heartbeat, now) if liveness else None,
    )


def query_instance(record: InstanceRecord, capability: Capability, liveness: Liveness, state: Status,
                   now: float) -> QueryInstance:
    return QueryInstance(
        agent_id=record.agent_id,
        state=state,
        endpoint=capability.endpoint,
        protocol=capability.protocol,
        version=capability.version,
        timeout_sla_ms=capability.timeout_sla_ms,
        max_payload_bytes=capability.max_payload_bytes,
        idempotent=capability.idempotent,
        trust_level=capability.trust_level,
        load=liveness.load,
        inflight=liveness.inflight,
        health=liveness.health,
        metadata=record.metadata,
        direct_fallback=record.direct_fallback,
        last_heartbeat_ms_ago=_ms_since(liveness.last_heartbeat, now),
    )
