"""Direct fallback: reaching an agent without the router, when the router cannot be reached.

Only instances that registered with ``direct_fallback`` and match the call's ``routing_hint`` (the
router's hard filter, :mod:`agent_reach.hint`) are called, in the order the registry offers them
(healthy first, least loaded first). The registry's last answer per capability is
kept, so a caller still finds agents when the registry is down as well. Every answer is marked
degraded: it skipped the router's policies, breakers and accounting. Calls carry
``X-Reach-Direct: 1``, which agents that declared the fallback accept without the router's
signature; the registry's /query needs a registration token (``registry_token``) when auth is on.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import msgspec

from agent_reach import peer_json
from agent_reach.atp import ErrorCode, RequestFrame, RouteFacts, error_frame, valid_routing_hint
from agent_reach.headers import DIRECT_HEADER
from agent_reach.hint import matches_hint, unsatisfied_hint
from agent_reach.transport import Answer, Unreachable, post
from agent_reach.versions import (
    DEFAULT_CAPABILITY_VERSION,
    check_constraint,
    instance_version,
    parse_constraint,
    parse_version,
    satisfies,
)

log = logging.getLogger("agentreach.sdk")


class Instance(msgspec.Struct, kw_only=True):
    """The part of the registry's /query answer a direct call needs."""

    agent_id: str
    endpoint: str
    protocol: str
    timeout_sla_ms: int
    direct_fallback: bool = False
    metadata: dict[str, Any] = {}
    version: str = DEFAULT_CAPABILITY_VERSION


class QueryAnswer(msgspec.Struct):
    instances: list[Instance]


class QueryRefused(Exception):
    """The registry wants a credential for /query that this caller did not send (or that is not valid)."""


class DirectRoute:
    def __init__(self, registry_url: str, registry_token: str | None = None):
        self._url = registry_url.rstrip("/")
        self._query_headers = {"Authorization": f"Bearer {registry_token}"} if registry_token else {}
        self._known: dict[str, list[Instance]] = {}

    async def _instances(self, session: aiohttp.ClientSession, capability: str) -> list[Instance] | None:
        """Fresh from the registry when it answers; its last answer when it does not; None if unknown."""
        try:
            async with session.post(f"{self._url}/query", json={"capability": capability},
                                    headers=self._query_headers, timeout=aiohttp.ClientTimeout(total=2.0)) as response:
                body = await response.read()
            if response.status == 404:
                self._known.pop(capability, None)
                return None
            if response.status == 200:
                self._known[capability] = peer_json.decode(body, type=QueryAnswer).instances
            elif response.status in (401, 403):
                raise QueryRefused(f"the registry refused the query (HTTP {response.status}): "
                                   f"{body[:200].decode(errors='replace')}; pass registry_token=")
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            log.warning("registry unreachable too; using its last answer", extra={"error": repr(exc)})
        return self._known.get(capability)

    async def send(self, session: aiohttp.ClientSession, frame: RequestFrame,
                   timeout: aiohttp.ClientTimeout, reason: str) -> Answer:
        capability = frame.capability or ""
        if not valid_routing_hint(frame.context):
            return error_frame(frame.request_id, ErrorCode.INVALID_FRAME, "context.routing_hint must be an object",
                               "context.routing_hint")
        try:
            found = await self._instances(session, capability) if capability else None
        except QueryRefused as exc:
            return error_frame(frame.request_id, ErrorCode.UNAUTHENTICATED, f"Router unreachable ({reason}) and {exc}")
        if found is None:
            return error_frame(frame.request_id, ErrorCode.UNKNOWN_CAPABILITY,
                               f"Router unreachable ({reason}) and the registry knows no capability {capability!r}")
        hint = frame.context.get("routing_hint")
        if hint:
            found = [instance for instance in found if matches_hint(instance.metadata, hint)]
            if not found:
                return error_frame(frame.request_id, ErrorCode.ROUTING_HINT_UNSATISFIABLE,
                                   f"Router unreachable ({reason}) and, for {capability!r}, {unsatisfied_hint(hint)}")
        if frame.version is not None:
            # A hard filter, as at the router: never a version outside the caller's constraint.
            if (problem := check_constraint(frame.version)) is not None:
                return error_frame(frame.request_id, ErrorCode.INVALID_FRAME, f"version: {problem}", "version")
            within = parse_constraint(frame.version)
            found = [instance for instance in found if satisfies(parse_version(
                instance_version(instance.version, instance.metadata.get("semver"))), within)]
            if not found:
                return error_frame(frame.request_id, ErrorCode.VERSION_UNSATISFIABLE,
                                   f"Router unreachable ({reason}) and no instance of {capability!r} has a version "
                                   f"satisfying {frame.version}")
        # Only HTTP calls go direct: an A2A agent's endpoint is its card, a WebSocket agent's takes the router's
        # multiplexed connection; the router alone speaks those.
        direct = [instance for instance in found if instance.direct_fallback and instance.protocol in ("atp", "rest")]
        for attempt, instance in enumerate(direct, start=1):
            try:
                answer = await post(session, instance.endpoint, frame, protocol=instance.protocol,
                                    headers={DIRECT_HEADER: "1"}, timeout=timeout)
            except Unreachable:
                continue
            answer.route = RouteFacts(instance=instance.agent_id, policy="direct", attempts=attempt, degraded=True,
                                      timeout_sla_ms=instance.timeout_sla_ms, capability=capability,
                                      reason="direct_fallback")
            log.warning("router unreachable; called an instance directly (degraded)",
                        extra={"request_id": frame.request_id, "capability": capability,
                               "instance": instance.agent_id, "router_error": reason})
            return answer
        why = (f"none of the {len(direct)} instances that accept direct calls answered" if direct
               else "no instance registered with direct_fallback")
        return error_frame(frame.request_id, ErrorCode.NO_ROUTABLE_INSTANCE,
                           f"Router unreachable ({reason}) and, for {capability!r}, {why}")
