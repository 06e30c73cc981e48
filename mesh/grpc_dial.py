"""gRPC channels to agents, held to the egress rule (mesh/egress.py): the router's calls and the registry's
health probes of ``grpc`` instances.

gRPC resolves names itself, past our rule, so the name is resolved here, every address judged, and the channel
opened to the first allowed address (the endpoint kept as the authority): a name pointed elsewhere after it was
registered gains nothing, as with mesh/egress_client.py for HTTP.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
from agent_reach.grpc_wire import parse_target
from grpc_health.v1 import health_pb2

from mesh.egress import Egress, is_address
from mesh.egress_client import EgressRefused

HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
# Reconnect waits after a failed connection, as WebSocket links have (router/transports/websocket.py).
# (grpc.min_reconnect_backoff_ms is left alone: gRPC takes it as the shortest time a connect may take.)
_BACKOFF_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 2000)]


async def allowed_target(egress: Egress, endpoint: str) -> str:
    """The gRPC target for ``endpoint`` (``host:port``): its first address the rule allows. Raises
    EgressRefused when none is, OSError when the name does not resolve, ValueError for no host:port."""
    host, port = parse_target(endpoint)
    host = host.strip("[]")
    if is_address(host):
        addresses = [host]
    else:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(entry[4][0]) for entry in found]
    allowed = [address for address in addresses if egress.address_refusal(address) is None]
    if not allowed:
        reasons = "; ".join(sorted({egress.address_refusal(address) or "" for address in addresses}))
        raise EgressRefused(f"the egress rule refuses every address of {host}: {reasons}")
    address = allowed[0]
    return f"ipv6:[{address}]:{port}" if ":" in address else f"ipv4:{address}:{port}"


def open_channel(target: str, endpoint: str, max_receive_bytes: int) -> grpc.aio.Channel:
    """A channel with no retries of its own (the router decides those) and answers capped at ``max_receive_bytes``."""
    options: list[tuple[str, Any]] = [("grpc.default_authority", endpoint), ("grpc.enable_retries", 0),
                                      ("grpc.max_receive_message_length", max_receive_bytes),
                                      ("grpc.max_send_message_length", -1), *_BACKOFF_OPTIONS]
    return grpc.aio.insecure_channel(target, options=options)


async def serving(egress: Egress, endpoint: str, timeout_s: float) -> bool:
    """Whether the agent at ``endpoint`` answers the standard health check SERVING within ``timeout_s``."""
    try:
        target = await asyncio.wait_for(allowed_target(egress, endpoint), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return False
    async with open_channel(target, endpoint, 64 * 1024) as channel:
        try:
            answer = await channel.unary_unary(
                HEALTH_CHECK_METHOD, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
