"""The durable instance record, and the pure step that turns a registration into one."""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.registration import Capability, RegisterRequest, known_metadata
from auth.records import (
    ADMIN_KEY, CLIENT_PREFIX, PUBLISHED_KEY_PREFIX, TOKEN_PREFIX, AdminRecord, ClientRecord, PublishedKey, TokenRecord,
)
from router.policy import Policy
from router.reach import AlertConfig
from yarl import URL

from registry.errors import RegistryError, from_decode_error

INSTANCE_PREFIX = "instances/"
POLICY_PREFIX = "policies/"
ALERTS_KEY = "settings/alerts"


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


# Which record a key holds, by key prefix: the store (msgpack) and the watch feed (JSON) both decode by it.
RECORD_TYPES: list[tuple[str, type]] = [
    (INSTANCE_PREFIX, InstanceRecord), (POLICY_PREFIX, Policy), (ALERTS_KEY, AlertConfig),
    (CLIENT_PREFIX, ClientRecord), (TOKEN_PREFIX, TokenRecord), (ADMIN_KEY, AdminRecord),
    (PUBLISHED_KEY_PREFIX, PublishedKey),
]

_encoder = msgspec.msgpack.Encoder()
_decoders = [(prefix, msgspec.msgpack.Decoder(kind)) for prefix, kind in RECORD_TYPES]


def instance_key(agent_id: str) -> str:
    return INSTANCE_PREFIX + agent_id


def policy_key(capability: str) -> str:
    return POLICY_PREFIX + capability


def encode_value(value: msgspec.Struct) -> bytes:
    """Any stored record (instance, policy, alert settings) as the store keeps it."""
    return _encoder.encode(value)


def decode_value(key: str, data: bytes) -> Any:
    """A stored record back as the object it holds, chosen by its key."""
    for prefix, decoder in _decoders:
        if key.startswith(prefix):
            return decoder.decode(data)
    return None


def _absolute_url(value: str, field: str) -> URL:
    try:
        url = URL(value)
    except (ValueError, TypeError) as exc:
        raise RegistryError(400, "invalid_url", f"Not a valid URL: {value!r} ({exc})", field) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise RegistryError(400, "invalid_url", f"Expected an absolute http(s) URL, got {value!r}", field)
    return url


def _resolve_endpoint(endpoint: str, base: URL | None, field: str) -> URL:
    if endpoint.startswith("/"):
        if base is None:
            raise RegistryError(
                400, "invalid_url", f"Endpoint {endpoint!r} is a path, so base_url is required", field
            )
        return base.join(URL(endpoint))
    return _absolute_url(endpoint, field)


def build_record(request: RegisterRequest, now: float, token_id: str | None = None) -> InstanceRecord:
    """Validate what the schema cannot (URLs, duplicates, known metadata) and resolve endpoints."""
    try:
        known_metadata(request.metadata)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc, prefix="metadata") from None
    base = _absolute_url(request.base_url, "base_url") if request.base_url is not None else None
    seen: set[str] = set()
    capabilities = []
    for position, capability in enumerate(request.capabilities):
        if capability.name in seen:
            raise RegistryError(
                400, "duplicate_capability",
                f"Capability {capability.name!r} appears more than once in this registration",
                f"capabilities[{position}].name",
            )
        seen.add(capability.name)
        endpoint = _resolve_endpoint(capability.endpoint, base, f"capabilities[{position}].endpoint")
        capabilities.append(msgspec.structs.replace(capability, endpoint=str(endpoint)))
    if request.health_url is not None:
        health_url = str(_resolve_endpoint(request.health_url, base, "health_url"))
    else:
        health_url = str(URL(capabilities[0].endpoint).origin().with_path("/healthz"))
    return InstanceRecord(
        agent_id=request.agent_id,
        service=request.service or request.agent_id,
        capabilities=capabilities,
        health_url=health_url,
        metadata=dict(request.metadata),
        base_url=str(base) if base is not None else None,
        direct_fallback=request.direct_fallback,
        registered_at=now,
        token_id=token_id,
    )
