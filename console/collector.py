"""The console's heartbeat: poll the registry and the router about once a second, derive the live
views, fold what is final into the hourly store and push the result to every open browser.

Polling (rather than following the watch feed) keeps the console a plain HTTP client of the
public APIs: it runs in `agentreach up` or apart from the mesh with the same code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import Any, TypeVar

import msgspec
from agent_reach import peer_json

from console.heartbeats import HeartbeatLog
from console.hub import Hub
from console.models import AgentRow, Overview, ReachPoint, TrafficStat, UpstreamStatus
from console.rollup import PeriodKey, counter_deltas, period_totals, raw_success_of, reach_of, reach_points, recent
from console.store import ConsoleStore
from console.traffic import Sample, TrafficWindow, samples_of
from console.upstream import Reply, Upstream
from mesh.quality import QualityAlert
from registry.views import AgentView
from router.reach import Alert, PeriodSummary
from router.traces import CallTrace

log = logging.getLogger("agentreach.console.collector")

CPS_SECONDS = 10.0
REACH_WINDOW_SECONDS = 300
CURVE_SECONDS = 3600
TRACES_PER_POLL = 1000
SEEN_TRACES_KEPT = 50_000
PRUNE_EVERY_SECONDS = 3600
_encoder = msgspec.json.Encoder()
T = TypeVar("T")


class AgentsAnswer(msgspec.Struct):
    agents: list[AgentView]


class ReachAnswer(msgspec.Struct):
    period_seconds: float
    periods: list[PeriodSummary]
    instance_health_rate: float | None = None
    route_decisions: dict[str, int] = {}


class AlertsAnswer(msgspec.Struct):
    alerts: list[Alert]
    config: dict[str, Any] = {}


class QualityAlertsAnswer(msgspec.Struct):
    alerts: list[QualityAlert]


class TracesAnswer(msgspec.Struct):
    traces: list[CallTrace]


def decoded(reply: Reply, kind: type[T], status: UpstreamStatus, now: float) -> T | None:
    """The reply decoded as ``kind``, recording on ``status`` whether that worked; None if not."""
    status.checked_at = now
    if not reply.ok:
        status.ok, status.error = False, reply.error()
        return None
    try:
        value = peer_json.decode(reply.body, type=kind)
    except msgspec.MsgspecError as exc:
        status.ok, status.error = False, f"unexpected answer: {exc}"
        return None
    status.ok, status.error = True, None
    return value


def agent_row(agent: AgentView, traffic: TrafficStat) -> AgentRow:
    zone, model = agent.metadata.get("zone"), agent.metadata.get("model")
    return AgentRow(agent_id=agent.agent_id, service=agent.service, state=agent.state,
                    capabilities=[capability.name for capability in agent.capabilities],
                    heartbeat_age_ms=agent.last_heartbeat_ms_ago, load=agent.load, inflight=agent.inflight,
                    zone=str(zone) if zone not in (None, "") else None,
                    model=str(model) if model not in (None, "") else None, traffic=traffic)


class Collector:
    def __init__(self, registry: Upstream, router: Upstream, store: ConsoleStore, hub: Hub, interval: float = 1.0):
        self.registry = registry
        self.router = router
        self.store = store
        self.hub = hub
        self.interval = interval
        self.agents: list[AgentView] = []
        self.reach = ReachAnswer(period_seconds=60.0, periods=[])
        self.alerts: list[Alert] = []
        # The registry's quality alerts (registry/quality.py): live instances below their quality floor.
        self.quality_alerts: list[QualityAlert] = []
        self.registry_status = UpstreamStatus()
        self.router_status = UpstreamStatus()
        self.traces_status = UpstreamStatus()
        self.heartbeats = HeartbeatLog()
        self.traffic = TrafficWindow()
        self._totals: dict[PeriodKey, int] | None = None
        self._calls: deque[tuple[float, int]] = deque()
        self._decisions: dict[str, int] | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._counted_before = 0.0
        self._pruned_at = 0.0
        self.polls = 0

    async def load(self) -> None:
        """Pick up where a previous console left off, so nothing is counted twice."""
        counters = await self.store.get_meta("decision_counters")
        self._decisions = counters if isinstance(counters, dict) else None
        self._counted_before = float(await self.store.get_meta("traces_watermark", 0.0))

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("console poll failed")
            await asyncio.sleep(self.interval)

    def statuses(self) -> dict[str, UpstreamStatus]:
        return {"registry": self.registry_status, "router": self.router_status, "traces": self.traces_status}

    async def tick(self) -> None:
        self.polls += 1
        agents, reach, alerts, traces, quality = await asyncio.gather(
            self.registry.get("/agents"), self.router.get("/reach"), self.router.get("/alerts"),
            self.router.get("/traces", {"limit": str(TRACES_PER_POLL)}), self.registry.get("/quality"))
        now = time.time()
        self._take_agents(decoded(agents, AgentsAnswer, self.registry_status, now), now)
        await self._take_reach(decoded(reach, ReachAnswer, self.router_status, now), now)
        answered = decoded(alerts, AlertsAnswer, UpstreamStatus(), now)
        self.alerts = answered.alerts if answered is not None else self.alerts
        scored = decoded(quality, QualityAlertsAnswer, UpstreamStatus(), now)
        self.quality_alerts = scored.alerts if scored is not None else self.quality_alerts
        await self._take_traces(decoded(traces, TracesAnswer, self.traces_status, now))
        if now - self._pruned_at > PRUNE_EVERY_SECONDS:
            await self.store.prune(now)
            self._pruned_at = now
        self.hub.publish("overview", _encoder.encode(self.overview(now)))
        if self.hub.wanted("agents"):
            self.hub.publish("agents", _encoder.encode({"agents": self.agent_rows(now)}))

    def _take_agents(self, answer: AgentsAnswer | None, now: float) -> None:
        if answer is None:
            return
        self.agents = answer.agents
        self.heartbeats.observe(self.agents, now)

    async def _take_reach(self, answer: ReachAnswer | None, now: float) -> None:
        if answer is None:
            return
        self.reach = answer
        totals = period_totals(answer.periods)
        added = sum(counter_deltas(self._totals, totals).values()) if self._totals is not None else 0
        self._totals = totals
        self._calls.append((now, added))
        while self._calls and self._calls[0][0] < now - CPS_SECONDS:
            self._calls.popleft()
        await self.store.fold_periods(answer.periods)
        counters = dict(answer.route_decisions)
        if self._decisions is None:
            self._decisions = counters
            await self.store.add_decisions({}, counters, now)
        elif counters != self._decisions:
            deltas = counter_deltas(self._decisions, counters)
            self._decisions = counters
            await self.store.add_decisions(deltas, counters, now)

    async def _take_traces(self, answer: TracesAnswer | None) -> None:
        if answer is None:
            return
        samples: list[Sample] = []
        watermark = self._counted_before
        for call in reversed(answer.traces):
            if call.request_id in self._seen or call.started_at <= self._counted_before:
                continue
            self._seen[call.request_id] = None
            samples.extend(samples_of(call))
            watermark = max(watermark, call.started_at)
        while len(self._seen) > SEEN_TRACES_KEPT:
            self._seen.popitem(last=False)
        if samples:
            self.traffic.add(samples)
            await self.store.add_samples(samples, watermark)

    def owners(self) -> dict[str, str]:
        """Every capability a live instance offers, and the service that owns it."""
        owners: dict[str, str] = {}
        for agent in self.agents:
            if agent.state != "evicted":
                for capability in agent.capabilities:
                    owners.setdefault(capability.name, agent.service)
        return owners

    def calls_per_second(self, now: float) -> float:
        if len(self._calls) < 2:
            return 0.0
        span = now - self._calls[0][0]
        return round(sum(added for _, added in list(self._calls)[1:]) / span, 3) if span > 0 else 0.0

    def curve(self, now: float) -> list[ReachPoint]:
        """The last hour, one point per router period, every capability merged."""
        return reach_points(period for period in self.reach.periods if period.end > now - CURVE_SECONDS)

    def overview(self, now: float) -> Overview:
        states: dict[str, int] = {}
        for agent in self.agents:
            states[agent.state] = states.get(agent.state, 0) + 1
        window = recent(self.reach.periods, now, REACH_WINDOW_SECONDS)
        return Overview(
            at=now, registered_agents=len(self.agents) - states.get("evicted", 0),
            available_instances=states.get("healthy", 0), calls_per_second=self.calls_per_second(now),
            reach_rate=reach_of(window), raw_success_rate=raw_success_of(window),
            instance_health_rate=self.reach.instance_health_rate, window_seconds=REACH_WINDOW_SECONDS,
            states=states, active_alerts=sum(alert.state == "active" for alert in self.alerts),
            quality_alerts=len(self.quality_alerts),
            curve=self.curve(now), registry=self.registry_status, router=self.router_status,
            traces=self.traces_status)

    def agent_rows(self, now: float) -> list[AgentRow]:
        traffic = self.traffic.by_agent(now)
        return [agent_row(agent, traffic.get(agent.agent_id, TrafficStat()))
                for agent in sorted(self.agents, key=lambda agent: (agent.service, agent.agent_id))]
