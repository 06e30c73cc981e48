"""What an agent sends the registry: its registration and its heartbeats.

The SDK encodes these and the registry decodes them, so both sides share one schema.
Decoding with msgspec validates types, ranges and unknown fields in one step.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z"

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
Label = Annotated[str, msgspec.Meta(max_length=256)]
Protocol = Literal["atp", "rest", "a2a", "websocket", "grpc", "mq", "mcp"]
RoutingPolicy = Literal["least_load", "hash", "affinity", "scored"]
TrustLevel = Literal["internal", "user_authorized", "public"]

# What msgspec (and so the WAL and the watch feed) can encode: a bigger int is refused at the edge.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
MetadataValue = str | Int64 | float | bool
# A JSON Schema object (draft 2020-12 unless its $schema says otherwise); the registry checks it is one
# (mesh/schemas.py), the router validates payloads against an input_schema.
Schema = Annotated[dict[str, Any], msgspec.Meta(max_length=1024)]
# A price, unit-free (agent_reach/usage.py); bounded so a cost summed over many calls stays finite.
Price = Annotated[float, msgspec.Meta(ge=0, le=1e12)]


class Capability(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One thing an agent can do, and how to reach it."""

    name: Name
    endpoint: Url
    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "1.0"
    protocol: Protocol = "atp"
    timeout_sla_ms: Annotated[int, msgspec.Meta(gt=0, le=3_600_000)] = 30_000
    max_payload_bytes: Annotated[int, msgspec.Meta(gt=0, le=64 * 1024 * 1024)] = 1024 * 1024
    description: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    examples: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]],
        msgspec.Meta(max_length=64),
    ] = []
    idempotent: bool = False
    trust_level: TrustLevel | None = None
    # What a call costs (agent_reach/usage.py). Added after the stored layout was fixed
    # (tests/test_mesh_contract.py): UNSET until given, so a capability without prices keeps its bytes.
    cost_per_call: Price | UnsetType = UNSET
    cost_per_1k_input_tokens: Price | UnsetType = UNSET
    cost_per_1k_output_tokens: Price | UnsetType = UNSET
    # What the payload and the answer look like (JSON Schema); UNSET like the prices, for the same reason.
    input_schema: Schema | UnsetType = UNSET
    output_schema: Schema | UnsetType = UNSET


class KnownMetadata(msgspec.Struct, kw_only=True):
    """The metadata keys the mesh itself reads; any other scalar key is a free label."""

    zone: Label = ""
    model: Label = ""
    max_qps: Annotated[float, msgspec.Meta(ge=0)] = 0
    semver: Label = ""
    routing_policy: RoutingPolicy | None = None


class RegisterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent_id: Name
    capabilities: Annotated[list[Capability], msgspec.Meta(min_length=1, max_length=256)]
    service: Name | None = None
    base_url: Url | None = None
    health_url: Url | None = None
    metadata: Annotated[dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], MetadataValue],
                        msgspec.Meta(max_length=64)] = {}
    direct_fallback: bool = False


class HeartbeatRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent_id: Name
    load: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    inflight: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    health: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    metrics: Annotated[dict[Annotated[str, msgspec.Meta(max_length=128)], Int64 | float],
                       msgspec.Meta(max_length=64)] | None = None


class AgentRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A request that names one agent instance (deregister)."""

    agent_id: Name


class CapabilityRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A request that names one capability (query)."""

    capability: Name


def known_metadata(metadata: dict[str, Any]) -> KnownMetadata:
    """Validate the keys the mesh reads; raises msgspec.ValidationError with a `$.key` path."""
    return msgspec.convert(metadata, KnownMetadata)
