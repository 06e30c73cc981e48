"""The pure step that turns a registration into the instance record the store keeps (mesh/records.py)."""

from __future__ import annotations

import msgspec
from agent_reach.grpc_wire import parse_target
from agent_reach.mq_wire import SCHEMES, endpoint_for, parse_endpoint
from agent_reach.registration import Capability, RegisterRequest, known_metadata
from yarl import URL

from mesh.records import InstanceRecord
from mesh.schemas import schema_problem
from weblayer.errors import ApiError, from_decode_error

# A health URL with this scheme names a gRPC agent's host:port, probed with grpc.health.v1.Health.
GRPC_HEALTH_SCHEME = "grpc"
# A health URL with this prefix names an MCP server's URL, probed with an MCP ping (mesh/mcp_client.py).
MCP_HEALTH_PREFIX = "mcp+"


def _absolute_url(value: str, field: str, schemes: tuple[str, ...] = ("http", "https")) -> URL:
    try:
        url = URL(value)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, "invalid_url", f"Not a valid URL: {value!r} ({exc})", field) from None
    if url.scheme not in schemes or not url.host:
        raise ApiError(400, "invalid_url", f"Expected an absolute {'/'.join(schemes)} URL, got {value!r}", field)
    if url.scheme == GRPC_HEALTH_SCHEME:
        _grpc_target(url.raw_authority, field)
    return url


def _grpc_target(endpoint: str, field: str) -> str:
    try:
        parse_target(endpoint)
    except ValueError as exc:
        raise ApiError(400, "invalid_endpoint", f"A grpc endpoint is host:port: {exc}", field) from None
    return endpoint


def _resolve_endpoint(endpoint: str, base: URL | None, field: str) -> URL:
    if endpoint.startswith("/"):
        if base is None:
            raise ApiError(
                400, "invalid_url", f"Endpoint {endpoint!r} is a path, so base_url is required", field
            )
        return base.join(URL(endpoint))
    return _absolute_url(endpoint, field)


def _mq_endpoint(endpoint: str, field: str) -> str:
    """An mq endpoint names its broker and request stream (agent_reach.mq_wire): the registry keeps no broker of
    its own, so one that names none has no broker configured at all."""
    try:
        broker, stream = parse_endpoint(endpoint)
    except ValueError as exc:
        code = "invalid_endpoint" if endpoint.startswith(tuple(f"{scheme}:" for scheme in SCHEMES)) else "no_broker"
        raise ApiError(400, code, f"An mq capability with no broker configured: {exc}" if code == "no_broker"
                       else f"Not an mq endpoint: {exc}", field) from None
    return endpoint_for(broker, stream)


def _endpoint(capability: Capability, base: URL | None, field: str) -> str:
    """Where the capability is reached: a URL (a path joins base_url), host:port for gRPC, broker and stream for mq."""
    if capability.protocol == "grpc":
        return _grpc_target(capability.endpoint, field)
    if capability.protocol == "mq":
        return _mq_endpoint(capability.endpoint, field)
    resolved = _resolve_endpoint(capability.endpoint, base, field)
    if capability.protocol == "mcp" and not resolved.fragment:
        raise ApiError(400, "invalid_endpoint", "An mcp endpoint is the server's URL with the tool's name as its "
                       "fragment (http://host:port/mcp#tool)", field)
    return str(resolved)


def _health_url(request: RegisterRequest, capabilities: list[Capability], base: URL | None) -> str:
    """Where the registry probes the instance: as registered, an A2A agent's card, a gRPC agent's grpc.health.v1,
    else the /healthz of its first HTTP endpoint (or of its base_url: an mq capability has no HTTP endpoint)."""
    if request.health_url is not None and request.health_url.startswith(f"{GRPC_HEALTH_SCHEME}:"):
        return str(_absolute_url(request.health_url, "health_url", (GRPC_HEALTH_SCHEME,)))
    if request.health_url is not None:
        return str(_resolve_endpoint(request.health_url, base, "health_url"))
    if capabilities[0].protocol == "a2a":
        return capabilities[0].endpoint  # an A2A agent is probed through its card
    if capabilities[0].protocol == "grpc":
        return f"{GRPC_HEALTH_SCHEME}://{capabilities[0].endpoint}"
    if capabilities[0].protocol == "mcp":  # an MCP server is probed with an MCP ping
        return MCP_HEALTH_PREFIX + str(URL(capabilities[0].endpoint).with_fragment(None))
    served = [URL(capability.endpoint) for capability in capabilities if capability.protocol not in ("mq", "grpc")]
    origin = served[0].origin() if served else base.origin() if base is not None else None
    if origin is None:
        raise ApiError(400, "invalid_url", "An agent serving only mq capabilities needs a health_url or a base_url "
                       "for the registry to probe", "health_url")
    return str(origin.with_path("/healthz"))


def _check_schemas(capability: Capability, field: str) -> None:
    for name, schema in (("input_schema", capability.input_schema), ("output_schema", capability.output_schema)):
        if isinstance(schema, dict) and (problem := schema_problem(schema)) is not None:
            raise ApiError(400, "invalid_schema", f"{name} of {capability.name!r} {problem}", f"{field}.{name}")


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
            raise ApiError(
                400, "duplicate_capability",
                f"Capability {capability.name!r} appears more than once in this registration",
                f"capabilities[{position}].name",
            )
        seen.add(capability.name)
        _check_schemas(capability, f"capabilities[{position}]")
        endpoint = _endpoint(capability, base, f"capabilities[{position}].endpoint")
        capabilities.append(msgspec.structs.replace(capability, endpoint=endpoint))
    health_url = _health_url(request, capabilities, base)
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
