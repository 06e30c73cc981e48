"""Automatic canary rollback: once a second, judge every split's canaries against stable, and write a failing
canary's weight 0 to the registry, where every router reads it from the watch feed.

Several routers may judge the same canary failing at once: each writes the policy it holds with that
share's weight set to 0, so the writes agree and a repeat changes nothing (a router whose mirror already
shows weight 0 does not write at all). Promotion stays an operator's step: nothing here raises a weight.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from agent_reach.headers import API_KEY_HEADER

from mesh.policy import Policy
from router.canary import CanaryWindows, Sample, figures, rollback_reason, stable_index
from router.mirror import RegistryMirror

log = logging.getLogger("agentreach.router")

# Stores a capability's policy in the registry (PUT /policies/{capability}, or in process).
WritePolicy = Callable[[str, Policy], Awaitable[object]]
ROLLBACKS_KEPT = 50


class RollbackAlert(msgspec.Struct, kw_only=True):
    capability: str
    version: str  # the canary share rolled back
    stable: str
    reason: str
    at: float  # unix seconds
    written: bool  # False: the registry could not be written (the next tick tries again)


class Releases:
    def __init__(self) -> None:
        self.windows = CanaryWindows()
        self.rollbacks: deque[RollbackAlert] = deque(maxlen=ROLLBACKS_KEPT)
        self.write: WritePolicy | None = None
        # Canaries judged failing whose weight 0 could not be written yet: alerted once, retried every tick.
        self._unwritten: set[tuple[str, str]] = set()

    def record(self, capability: str, version: str, ok: bool, ms: float) -> None:
        self.windows.record(capability, version, Sample(time.monotonic(), ok, ms))

    async def judge(self, mirror: RegistryMirror) -> None:
        """Roll back every canary worse than its stable share; one pass over the policies with a rollback."""
        now = time.monotonic()
        for capability, policy in list(mirror.keys.policies.items()):
            config, shares = policy.rollback_config, policy.shares
            if config is None or len(shares) < 2:
                continue
            stable = shares[stable_index(shares)]
            baseline = figures(self.windows.window(capability, stable.version, now, config.window_seconds))
            for share in shares:
                if share is stable or share.weight == 0:
                    continue
                canary = figures(self.windows.window(capability, share.version, now, config.window_seconds))
                reason = rollback_reason(config, canary, baseline)
                if reason is not None:
                    await self._roll_back(capability, policy, share.version, stable.version, reason)

    async def _roll_back(self, capability: str, policy: Policy, version: str, stable: str, reason: str) -> None:
        split = [msgspec.structs.replace(share, weight=0) if share.version == version else share
                 for share in policy.shares]
        written = False
        if self.write is not None:
            try:
                await self.write(capability, msgspec.structs.replace(policy, split=split))
                written = True
            except Exception as exc:  # any failure to write: alert anyway, try again next tick
                log.error("canary rollback not written", extra={"capability": capability, "version": version,
                                                                "error": repr(exc)})
        if written:
            self.windows.forget(capability, version)
            self._unwritten.discard((capability, version))
        elif (capability, version) in self._unwritten:
            return
        else:
            self._unwritten.add((capability, version))
        self.rollbacks.appendleft(RollbackAlert(capability=capability, version=version, stable=stable, reason=reason,
                                                at=time.time(), written=written))
        log.error("canary_rollback", extra={"capability": capability, "version": version, "stable": stable,
                                            "reason": reason, "written": written})


_TIMEOUT = aiohttp.ClientTimeout(total=5, sock_connect=2)


async def write_policy_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                                 capability: str, policy: Policy) -> None:
    """PUT /policies/{capability} on the registry the router follows (never following a redirect: the
    admin key goes to that registry only)."""
    headers = {"Content-Type": "application/json", **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.put(f"{registry_url}/policies/{capability}", data=msgspec.json.encode(policy),
                           headers=headers, allow_redirects=False, timeout=_TIMEOUT) as response:
        if response.status != 200:
            raise RuntimeError(f"registry answered {response.status}: {(await response.read())[:200]!r}")
