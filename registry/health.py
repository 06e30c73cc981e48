"""Active health checks of demoted instances, and evictions with a guard against mass eviction."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from agent_reach.exhaustion import Throttle, local_exhaustion

from mesh import mcp_client
from mesh.grpc_dial import serving
from mesh.mcp_client import McpFailure
from mesh.records import InstanceRecord
from registry.cluster import Membership
from registry.lifecycle import EvictionPlan, Status, plan_evictions, record_check
from registry.records import GRPC_HEALTH_SCHEME, MCP_HEALTH_PREFIX
from registry.service import Registry
from registry.store import Fenced
from wal import WalUnavailable

log = logging.getLogger("agentreach.registry.health")

PROBE_CONCURRENCY = 64


def never_beats(record: InstanceRecord) -> bool:
    """An instance of A2A agents or MCP servers only: they send no heartbeats, so every sweep probes them
    (through an A2A card, with an MCP ping), and a passing probe is their heartbeat."""
    return all(capability.protocol in ("a2a", "mcp") for capability in record.capabilities)


class HealthChecker:
    """Every ``health_interval`` seconds: probe demoted instances, then evict what the plan allows."""

    def __init__(self, registry: Registry, session: aiohttp.ClientSession, membership: Membership):
        self._registry = registry
        self._membership = membership
        self._session = session
        self._probes = asyncio.Semaphore(PROBE_CONCURRENCY)
        self.guard_active = False
        # "unprobed": probes this process could not send (out of descriptors...): no verdict on anyone.
        self.checks = {"pass": 0, "fail": 0, "unprobed": 0}
        self._unprobed_reports = Throttle()
        self._refused_evictions = Throttle()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._registry.config.health_interval)
            if not self._membership.leads():
                continue  # the leader sweeps for the whole cluster; its view is the global one
            try:
                await self.sweep()
            except Exception:
                log.exception("health sweep failed; retrying next interval")

    async def _probe(self, url: str) -> bool | None:
        """Whether the instance answered 2xx (a ``grpc://host:port`` one: SERVING to the standard gRPC health
        check); None when the probe never left this process (EMFILE, ENOBUFS...): the registry's own trouble,
        which must not count toward evicting anyone."""
        timeout_s = min(self._registry.config.health_interval, 2.0)
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._probes:
            if url.startswith(f"{GRPC_HEALTH_SCHEME}://"):
                return await serving(self._registry.egress, url.removeprefix(f"{GRPC_HEALTH_SCHEME}://"), timeout_s)
            try:
                if url.startswith(MCP_HEALTH_PREFIX):
                    await mcp_client.ping(self._session, url.removeprefix(MCP_HEALTH_PREFIX), timeout)
                    return True
                async with self._session.get(url, timeout=timeout, allow_redirects=False) as response:
                    return 200 <= response.status < 300
            except McpFailure:
                return False
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                return None if local_exhaustion(exc) is not None else False

    async def sweep(self) -> EvictionPlan:
        registry = self._registry
        grouped = registry.records_by_status(registry.clock())
        demoted = grouped[Status.DEMOTED]
        probed = demoted + [record for status in (Status.PENDING, Status.HEALTHY) for record in grouped[status]
                            if never_beats(record)]
        results = await asyncio.gather(*(self._probe(record.health_url) for record in probed))
        now = registry.clock()
        self._report_unprobed(results.count(None))
        for record, passed in zip(probed, results, strict=True):
            liveness = registry.state.liveness.get(record.agent_id)
            if liveness is None or passed is None:
                continue
            record_check(liveness, passed, now)
            registry.touched.add(record.agent_id)
            if passed:
                registry.heard.add(record.agent_id)
            self.checks["pass" if passed else "fail"] += 1
        failing = [
            agent_id for agent_id, liveness in registry.state.liveness.items()
            if liveness.failed_checks >= registry.config.evict_after
            and registry.status(agent_id, now) is Status.DEMOTED
        ]
        live = sum(len(grouped[status]) for status in (Status.PENDING, Status.HEALTHY, Status.DEMOTED))
        plan = plan_evictions(failing, live, len(demoted), registry.config)
        self._report_guard(plan, live, len(demoted))
        await self._evict(plan.evict)
        return plan

    async def _evict(self, agent_ids: list[str]) -> None:
        """Evict in order; when the store refuses writes (a full disk) the rest wait for a later sweep,
        their failed checks kept, and the refusal is one line per interval rather than a traceback
        every sweep for as long as the outage lasts."""
        reason = f"{self._registry.config.evict_after} failed health checks"
        for done, agent_id in enumerate(agent_ids):
            try:
                await self._registry.evict(agent_id, reason, self._membership.fence())
            except Fenced as exc:
                log.error("this node lost the lead while evicting; the new leader decides",
                          extra={"problem": str(exc), "deferred": len(agent_ids) - done})
                return
            except WalUnavailable as exc:
                self._refused_evictions.log(log, logging.ERROR, "evictions wait until the store takes writes again",
                                            problem=str(exc), deferred=len(agent_ids) - done)
                return

    def _report_unprobed(self, unprobed: int) -> None:
        if not unprobed:
            return
        self.checks["unprobed"] += unprobed
        self._unprobed_reports.log(log, logging.ERROR, "health probes could not be sent: this process is out "
                                   "of a system resource; not counted against the instances", unprobed)

    def _report_guard(self, plan: EvictionPlan, live: int, silent: int) -> None:
        if plan.guard_active and not self.guard_active:
            log.error("EVICTION GUARD ON: most instances went silent at once; evictions paused",
                      extra={"silent": silent, "live": live, "deferred": plan.deferred})
        elif not plan.guard_active and self.guard_active:
            log.warning("eviction guard off: heartbeats are back; evictions resume",
                        extra={"silent": silent, "live": live})
        self.guard_active = plan.guard_active
