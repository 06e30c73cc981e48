"""Keeping one instance known to the registry: register, heartbeat, register again, deregister.

Heartbeats run on their own task at a fixed rate. A ``404 unknown_agent`` (the registry lost or
evicted us) triggers a new registration at once. When the registry cannot be reached the link
backs off exponentially with jitter, so a fleet does not stampede a recovering registry, while
the agent keeps serving the calls the router already sends it. Given several registries, the link
talks to one and moves to the next when it cannot be reached or answers 5xx (register and heartbeat
are safe to send again); a registry that does not know the instance answers 404 and gets a registration.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
import msgspec

from agent_reach.registration import AgentRef, HeartbeatRequest, RegisterRequest
from agent_reach.transport import Failover

log = logging.getLogger("agentreach.sdk")

_encoder = msgspec.json.Encoder()
MAX_BACKOFF = 30.0


class RegistryRejected(Exception):
    """The registry refused a registration or heartbeat (4xx, e.g. a revoked token): retrying will not fix it."""

    def __init__(self, status: int, body: bytes, what: str = "registration"):
        super().__init__(f"registry refused the {what} (HTTP {status}): {body.decode(errors='replace')}")
        self.status = status


class RegistryUnavailable(Exception):
    """The registry did not answer usefully (unreachable, timeout, 5xx): worth retrying later."""


def backoff(interval: float, failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: capped exponential, full jitter."""
    cap = max(interval, min(MAX_BACKOFF, interval * 10))
    ceiling = min(cap, interval * 2 ** min(failures, 16))
    return random.uniform(ceiling / 2, ceiling)


class RegistryLink:
    def __init__(self, session: aiohttp.ClientSession, registry_url: str | Sequence[str], *, interval: float,
                 registration: Callable[[], RegisterRequest],
                 heartbeat: Callable[[], Awaitable[HeartbeatRequest]], token: str | None = None):
        self._session = session
        self.registries = Failover(registry_url)
        self.interval = interval
        self._registration = registration
        self._heartbeat = heartbeat
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=max(2.0, min(interval * 2, 10.0)), sock_connect=2.0)
        self.registered = False
        self.beats = 0

    async def _post(self, path: str, body: msgspec.Struct) -> tuple[int, bytes]:
        """The first registry's answer that could be reached and was not a 5xx, in the link's failover order;
        when every one answered 5xx (none can store changes now), the last of those answers."""
        failures = []
        refused: tuple[int, bytes] | None = None
        for url in self.registries.order():
            try:
                async with self._session.post(f"{url}{path}", data=_encoder.encode(body), headers=self._headers,
                                              timeout=self._timeout, allow_redirects=False) as response:
                    answer = response.status, await response.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.registries.failed(url)
                failures.append(f"{url}{path}: {exc!r}")
                continue
            if answer[0] >= 500:
                # A node cut off from its store (or without quorum) refuses changes another node may take.
                self.registries.failed(url)
                refused = answer
                continue
            self.registries.answered(url)
            return answer
        if refused is not None:
            return refused
        raise RegistryUnavailable("; ".join(failures))

    async def register(self) -> None:
        request = self._registration()
        status, body = await self._post("/register", request)
        if 400 <= status < 500:
            raise RegistryRejected(status, body)
        if status != 200:
            raise RegistryUnavailable(f"registry answered {status} to /register")
        self.registered = True
        log.info("registered", extra={"agent_id": request.agent_id,
                                      "capabilities": [c.name for c in request.capabilities]})

    async def beat(self) -> None:
        beat = await self._heartbeat()
        status, body = await self._post("/heartbeat", beat)
        if status == 404:
            log.warning("registry does not know this instance; registering again",
                        extra={"agent_id": beat.agent_id, "answer": body.decode(errors="replace")})
            self.registered = False
            await self.register()
        elif 400 <= status < 500:
            raise RegistryRejected(status, body, "heartbeat")
        elif status != 200:
            raise RegistryUnavailable(f"registry answered {status} to /heartbeat")
        else:
            self.beats += 1

    async def run(self) -> None:
        """Forever: register until it works, then heartbeat every interval; back off on failures."""
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await (self.beat() if self.registered else self.register())
            except (RegistryUnavailable, RegistryRejected) as exc:
                failures += 1
                delay = backoff(self.interval, failures)
                level = logging.ERROR if isinstance(exc, RegistryRejected) else logging.WARNING
                if failures == 1 or isinstance(exc, RegistryRejected):
                    log.log(level, "registry link failing; still serving, retrying with backoff",
                            extra={"error": str(exc), "retry_in_s": round(delay, 3)})
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("registry link restored", extra={"failed_attempts": failures})
                failures = 0
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def deregister(self, agent_id: str) -> None:
        """Best effort: a registry that is down will demote and evict us on its own."""
        try:
            status, _ = await self._post("/deregister", AgentRef(agent_id=agent_id))
        except RegistryUnavailable as exc:
            log.warning("could not deregister; the registry will evict this instance", extra={"error": str(exc)})
            return
        self.registered = False
        log.info("deregistered", extra={"agent_id": agent_id, "status": status})
