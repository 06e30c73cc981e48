"""Traffic mirroring (Envoy's request mirror, Gateway API's RequestMirror): a share of a capability's calls is
copied, after the live call is answered, to an instance of another version; the copy's status and latency are
compared with the live answer's and recorded, its answer never returned.

A copy is fire-and-forget: no failover, no retry, no breaker, trace or reach accounting (it is not a call
anyone made). Only capabilities declared idempotent are mirrored unless the policy says otherwise: a
copy runs the work twice. At most MAX_IN_FLIGHT copies at a time; beyond that a copy is skipped, never queued.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

import msgspec
from agent_reach.atp import RequestFrame, new_request_id
from agent_reach.versions import parse_constraint, parse_version, satisfies

from mesh.policy import MirrorConfig
from router.canary import share_point
from router.mirror import Offer
from router.selection import HEALTHY
from router.transports.answer import AgentAnswer

log = logging.getLogger("agentreach.router")
MAX_IN_FLIGHT = 64
SAMPLES_KEPT = 5
SendCopy = Callable[[RequestFrame, Offer], Awaitable[AgentAnswer]]


def mirrored(config: MirrorConfig, capability: str, request_id: str, idempotent: bool) -> bool:
    """Whether this call is copied: its request falls in the configured percent (the same on every router)."""
    if not idempotent and not config.allow_non_idempotent:
        return False
    return share_point(f"{capability}\x00mirror", request_id) * 100 < config.percent


def status_of(answer: AgentAnswer | None) -> str:
    if answer is None:
        return "no_answer"
    return "success" if answer.error_code is None else answer.error_code.value


class MirrorSample(msgspec.Struct, kw_only=True):
    at: float
    request_id: str
    instance: str
    live: str
    mirror: str
    live_ms: float
    mirror_ms: float


class MirrorStats(msgspec.Struct, kw_only=True):
    capability: str
    version: str
    sent: int = 0
    skipped: int = 0  # no instance of the version, or MAX_IN_FLIGHT copies already out
    same_status: int = 0
    different_status: int = 0
    live_ms_sum: float = 0.0
    mirror_ms_sum: float = 0.0
    samples: list[MirrorSample] = []  # the latest disagreements, oldest first


class TrafficMirror:
    def __init__(self, send: SendCopy, rng: random.Random):
        self._send = send
        self._rng = rng
        self._stats: dict[str, MirrorStats] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def copy(self, frame: RequestFrame, capability: str, offers: list[Offer], config: MirrorConfig,
             live: str, live_ms: float) -> None:
        """``live``: the live call's status (``success`` or its error code)."""
        """Send a copy of an answered call to an instance of the mirror version, in the background."""
        stats = self._stats.get(capability)
        if stats is None or stats.version != config.version:
            stats = self._stats[capability] = MirrorStats(capability=capability, version=config.version)
        within = parse_constraint(config.version)
        targets = [offer for offer in offers
                   if offer.state.state == HEALTHY and satisfies(parse_version(offer.version), within)]
        if not targets or len(self._tasks) >= MAX_IN_FLIGHT:
            stats.skipped += 1
            return
        stats.sent += 1
        copy = msgspec.structs.replace(frame, request_id=new_request_id(),
                                       context={**frame.context, "mirror_of": frame.request_id})
        task = asyncio.get_running_loop().create_task(
            self._compare(stats, copy, frame.request_id, self._rng.choice(targets), live, live_ms))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _compare(self, stats: MirrorStats, copy: RequestFrame, request_id: str, target: Offer,
                       live: str, live_ms: float) -> None:
        started = time.monotonic()
        answer: AgentAnswer | None = None
        try:
            answer = await self._send(copy, target)
        except Exception:  # a copy's failure must never surface anywhere but in these figures
            log.exception("mirrored copy failed inside the router", extra={"capability": stats.capability})
        mirror_ms = (time.monotonic() - started) * 1000
        stats.live_ms_sum += live_ms
        stats.mirror_ms_sum += mirror_ms
        mirror_status = status_of(answer)
        if live == mirror_status:
            stats.same_status += 1
            return
        stats.different_status += 1
        stats.samples.append(MirrorSample(at=time.time(), request_id=request_id, instance=target.record.agent_id,
                                          live=live, mirror=mirror_status, live_ms=round(live_ms, 3),
                                          mirror_ms=round(mirror_ms, 3)))
        del stats.samples[:-SAMPLES_KEPT]

    def stats(self, capability: str | None = None) -> list[MirrorStats]:
        return [stats for name, stats in sorted(self._stats.items()) if capability is None or name == capability]
