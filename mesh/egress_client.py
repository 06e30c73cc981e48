"""The egress rule where connections to agents open: the router's calls and the registry's probes.

Names are judged after resolution (EgressResolver, wrapping aiohttp's own resolver), so a name that
resolves elsewhere than when it was registered (DNS rebinding) still reaches only allowed addresses;
aiohttp connects to an address in a URL without resolving it, so EgressConnector judges those itself,
from a verdict cached per host. A refusal is a connection that failed before anything was sent
(aiohttp.ClientConnectorError): the router fails over to another instance, a probe fails.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Coroutine
from typing import Any

import aiohttp
from agent_reach.exhaustion import Throttle
from agent_reach.headers import REQUEST_ID_HEADER
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.resolver import DefaultResolver
from aiohttp.tracing import Trace

from mesh.egress import MAX_VERDICTS, Egress

log = logging.getLogger("agentreach.egress")


class EgressRefused(OSError):
    """The egress rule refuses the address (every address of a name): no connection is opened."""

    def __init__(self, message: str):
        super().__init__(errno.EACCES, message)  # strerror: what aiohttp's ClientConnectorError says


class _Reports:
    """One refusal log line per host per interval, with how many were refused meanwhile."""

    def __init__(self, egress: Egress):
        self._rule = [str(network) for network in egress.networks]
        self._throttles: dict[str, Throttle] = {}

    def refused(self, host: str, reason: str, request_id: str | None = None) -> None:
        if len(self._throttles) >= MAX_VERDICTS:
            self._throttles.clear()
        throttle = self._throttles.setdefault(host, Throttle())
        throttle.log(log, logging.WARNING, "agent address refused by the egress rule (--agent-networks)", host=host,
                     reason=reason, rule=self._rule or "any address but link-local and metadata ones",
                     request_id=request_id)


class EgressResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses the rule allows; none left: EgressRefused."""

    def __init__(self, egress: Egress, reports: _Reports, inner: AbstractResolver | None = None):
        self._egress = egress
        self._reports = reports
        self._inner = inner or DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [result for result in found if self._egress.address_refusal(result["host"]) is None]
        if not allowed:
            reason = "; ".join(sorted({self._egress.address_refusal(result["host"]) or "" for result in found}))
            self._reports.refused(host, reason)
            raise EgressRefused(f"the egress rule refuses every address of {host}: {reason}")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class EgressConnector(aiohttp.TCPConnector):
    """A TCPConnector held to the egress rule: names through EgressResolver, addresses here."""

    def __init__(self, egress: Egress, **options: Any):
        self._reports = _Reports(egress)
        super().__init__(resolver=EgressResolver(egress, self._reports), **options)
        self._egress = egress

    def connect(self, req: ClientRequest, traces: list[Trace],
                timeout: aiohttp.ClientTimeout) -> Coroutine[Any, Any, Connection]:
        """Not a coroutine of its own: an allowed call pays a cached lookup, not another frame."""
        host = req.url.raw_host or ""
        reason = self._egress.host_refusal(host)
        if reason is not None:
            self._reports.refused(host, reason, req.headers.get(REQUEST_ID_HEADER))
            raise aiohttp.ClientConnectorError(req.connection_key, EgressRefused(f"the egress rule refuses {reason}"))
        return super().connect(req, traces, timeout)


def agents_session(egress: Egress, **connector: Any) -> aiohttp.ClientSession:
    """A session whose every connection is to an address the rule allows: for agents only (the
    registry and other mesh parts are reached through sessions of their own)."""
    return aiohttp.ClientSession(connector=EgressConnector(egress, **connector))
