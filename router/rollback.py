"""Automatic canary rollback: once a second, judge every split's canaries against stable, and write a failing
canary's weight 0 to the registry, where every router reads it from the watch feed.

The write is conditional on the policy the router judged (mesh/policy_writes.py): an operator's edit made
a moment earlier, which the router's feed has not brought yet, makes the registry refuse it with the policy
stored now, and the router sets the canary's weight 0 in that one instead (nothing else of it changed), or
writes nothing when it no longer sends the canary calls or no longer asks for rollbacks. Several routers
judging the same canary at once: the first writes, the others find weight 0 stored and write nothing.
Promotion stays an operator's step: nothing here raises a weight.
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
from mesh.policy_writes import PolicyChanged, policy_digest
from router.canary import CanaryWindows, Sample, figures, rollback_reason, stable_index
from router.mirror import RegistryMirror

log = logging.getLogger("agentreach.router")

# Stores a capability's policy in the registry (PUT /policies/{capability}, or in process), only over the
# policy whose digest is given: else raises PolicyChanged with the policy stored now.
WritePolicy = Callable[[str, Policy, str], Awaitable[object]]
ROLLBACKS_KEPT = 50
# Writes of one rollback refused because the policy kept changing: then the next tick tries again.
REWRITES = 3


def canary_zeroed(policy: Policy | None, version: str) -> Policy | None:
    """``policy`` with canary share ``version`` at weight 0; None when that would change nothing or is no
    longer asked for (no such share with calls, it is the stable share, no rollback rule, no policy)."""
    if policy is None or policy.rollback_config is None or len(policy.shares) < 2:
        return None
    shares = policy.shares
    stable = shares[stable_index(shares)]
    if not any(share.version == version and share.weight > 0 and share is not stable for share in shares):
        return None
    return msgspec.structs.replace(policy, split=[msgspec.structs.replace(share, weight=0)
                                                  if share.version == version else share for share in shares])


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
        written: bool | None = False
        if self.write is not None:
            try:
                written = await self._write_zero(self.write, capability, policy, version)
            except Exception as exc:  # any failure to write: alert anyway, try again next tick
                log.error("canary rollback not written", extra={"capability": capability, "version": version,
                                                                "error": repr(exc)})
        if written is None:
            self.windows.forget(capability, version)
            self._unwritten.discard((capability, version))
            return
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

    @staticmethod
    async def _write_zero(write: WritePolicy, capability: str, policy: Policy, version: str) -> bool | None:
        """Write the canary's weight 0 over ``policy``, or over the policy stored instead when the registry says
        it changed. True: written; None: the stored policy needs no rollback (nothing written); False: it kept
        changing (REWRITES refusals)."""
        based_on: Policy | None = policy
        for _ in range(REWRITES):
            zeroed = canary_zeroed(based_on, version)
            if based_on is None or zeroed is None:
                log.warning("canary rollback not written: the policy changed meanwhile and no longer sends the "
                            "canary calls or asks for rollbacks", extra={"capability": capability, "version": version})
                return None
            try:
                await write(capability, zeroed, policy_digest(based_on))
                return True
            except PolicyChanged as changed:
                based_on = changed.current
        log.error("canary rollback not written: the policy kept changing", extra={"capability": capability,
                                                                                 "version": version})
        return False


_TIMEOUT = aiohttp.ClientTimeout(total=5, sock_connect=2)


class _Refusal(msgspec.Struct):
    error: str = ""
    policy: Policy | None = None


async def write_policy_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                                 capability: str, policy: Policy, based_on: str) -> None:
    """PUT /policies/{capability} on the registry the router follows, If-Match ``based_on`` (never following a
    redirect: the admin key goes to that registry only)."""
    headers = {"Content-Type": "application/json", "If-Match": f'"{based_on}"',
               **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.put(f"{registry_url}/policies/{capability}", data=msgspec.json.encode(policy),
                           headers=headers, allow_redirects=False, timeout=_TIMEOUT) as response:
        if response.status == 200:
            return
        body = await response.read()
        if response.status == 409:
            refusal = msgspec.json.decode(body, type=_Refusal)
            if refusal.error == "policy_changed":
                raise PolicyChanged(capability, refusal.policy)
        raise RuntimeError(f"registry answered {response.status}: {body[:200]!r}")
