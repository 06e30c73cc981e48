"""What the store holds: its key names and the record each key carries, and their msgpack encoding.

The registry's log keeps these bytes and replays them at start, so the field names and types of
every record here are a stored format: change them only with a migration.
"""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.registration import Capability

from auth.records import AUTH_RECORD_TYPES
from mesh.alerts import AlertConfig
from mesh.examples import EXAMPLE_PREFIX, EXAMPLE_SETTINGS_PREFIX, ExampleSettings, LearnedExample
from mesh.intent_rules import INTENT_RULE_PREFIX, IntentRule
from mesh.policy import Policy
from mesh.quality import QUALITY_PREFIX, QualityScore

INSTANCE_PREFIX = "instances/"
POLICY_PREFIX = "policies/"
ALERTS_KEY = "settings/alerts"
BINDING_PREFIX = "agent-ids/"


class InstanceRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the store keeps for one agent instance; endpoints are already absolute URLs."""

    agent_id: str
    service: str
    capabilities: list[Capability]
    health_url: str
    metadata: dict[str, Any] = {}
    base_url: str | None = None
    direct_fallback: bool = False
    registered_at: float = 0.0
    evicted_at: float | None = None
    # The registration token it joined with (None with auth off): the router signs calls to it with its key.
    token_id: str | None = None


class AgentIdBinding(msgspec.Struct, kw_only=True):
    """The service an agent_id stays bound to after its instance deregistered (registry/bindings.py)."""

    service: str
    released_at: float


# Which record a key holds, by key prefix: the store (msgpack) and the watch feed (JSON) both decode by it.
# Bindings are the registry's own business: they are not here, so the feed carries them without a value.
RECORD_TYPES: list[tuple[str, type]] = [
    (INSTANCE_PREFIX, InstanceRecord), (POLICY_PREFIX, Policy), (ALERTS_KEY, AlertConfig), *AUTH_RECORD_TYPES,
    (EXAMPLE_PREFIX, LearnedExample), (EXAMPLE_SETTINGS_PREFIX, ExampleSettings), (QUALITY_PREFIX, QualityScore),
    (INTENT_RULE_PREFIX, IntentRule),
]

_encoder = msgspec.msgpack.Encoder()
_decoders: list[tuple[str, msgspec.msgpack.Decoder[Any]]] = [
    (prefix, msgspec.msgpack.Decoder(kind)) for prefix, kind in RECORD_TYPES
]
_binding_decoder = msgspec.msgpack.Decoder(AgentIdBinding)


def instance_key(agent_id: str) -> str:
    return INSTANCE_PREFIX + agent_id


def policy_key(capability: str) -> str:
    return POLICY_PREFIX + capability


def binding_key(agent_id: str) -> str:
    return BINDING_PREFIX + agent_id


def instance_id(key: str) -> str | None:
    """The agent_id an instance key names; None for any other key."""
    return key[len(INSTANCE_PREFIX):] if key.startswith(INSTANCE_PREFIX) else None


def encode_value(value: msgspec.Struct) -> bytes:
    """Any stored record (instance, policy, alert settings, binding, credential) as the store keeps it."""
    return _encoder.encode(value)


def decode_value(key: str, data: bytes) -> Any:
    """A stored record back as the object it holds, chosen by its key; None for a binding or unknown key."""
    for prefix, decoder in _decoders:
        if key.startswith(prefix):
            return decoder.decode(data)
    return None


def decode_binding(data: bytes) -> AgentIdBinding:
    return _binding_decoder.decode(data)
