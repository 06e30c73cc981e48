"""`--workers N` seen as one router: each worker serves its own views on a private unix socket, and answers
`/metrics`, `/reach`, `/traces`, `/usage`, `/rules/stats`, `/scores` and `/alerts` on the shared port with every
worker's views merged (router/merged.py), so a scrape reaches the whole router whichever worker the kernel hands it to.

The sockets live in a directory the workers' parent made for this run (mode 0700, a random name, removed when it
stops; one socket a worker, 0600): only this user reaches them, and nothing is bound to a network. A router alone
has no socket and answers its own views as it always did.

A sibling whose socket nobody listens on has died (its counts with it) and is being restarted: the answer goes on
without it. A sibling that is there but does not answer in time fails the answer (503): counters summed without a
live worker would fall and rise again, which Prometheus would read as two counter resets.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
from agent_reach.admission import Gate
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from yarl import URL

from router.api import router_metrics
from router.core import Router
from router.inspection import (
    MAX_TRACES_LISTED,
    alerts_of,
    found_trace,
    reach_view,
    rule_stats_of,
    scores_of,
    trace_not_found,
    usage_period,
    usage_periods,
)
from router.merged import (
    AlertsAnswer,
    Family,
    RuleStats,
    TraceAnswer,
    families,
    label_scores,
    merge_alerts,
    merge_metrics,
    merge_reach,
    merge_rule_stats,
    merge_traces,
    merge_usage,
    newest_trace,
)
from router.metrics import SUMMED_GAUGES
from router.reach import ReachView
from router.scoring import InstanceScore
from router.traces import CallTrace
from router.usage import PeriodUsage
from weblayer.errors import ApiError
from weblayer.reading import bounded_int
from weblayer.responses import json_response

# A sibling answers from memory in milliseconds; past this it is stuck, and the whole answer fails rather than lie.
SIBLING_TIMEOUT = aiohttp.ClientTimeout(total=5)
# Connecting to a sibling's socket fails so only when nobody listens there (dead) or it is not there yet.
GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT})
_encode = msgspec.msgpack.encode


class WorkerViews(msgspec.Struct, frozen=True, kw_only=True):
    """Where `--workers N`'s private sockets are; every worker gets the same but for its ``index``."""

    directory: Path
    count: int
    index: int = 0

    def socket(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"


class Fixed(Collector):
    """Metrics already collected, for the exposition writer."""

    def __init__(self, metrics: list[Metric]):
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


def _unavailable(index: int, why: object) -> ApiError:
    return ApiError(503, "worker_unavailable", f"Router worker {index} did not answer ({why!r}); this router's "
                                               "view needs every live worker's")


def _msgpack(value: Any) -> web.Response:
    return web.Response(body=_encode(value), content_type="application/msgpack")


def _filters(request: web.Request, *names: str) -> dict[str, str]:
    """The query parameters ``names`` the request has, to ask siblings the same."""
    return {name: request.query[name] for name in names if name in request.query}


def _traces_query(request: web.Request) -> dict[str, str]:
    """A /traces query as siblings are asked it: the limit checked once, here."""
    return {"limit": str(bounded_int(request, "limit", 50, 1, MAX_TRACES_LISTED)), **_filters(request, "capability")}


class Views:
    """This worker's own views on its private socket, and the whole router's for the shared port (``handlers``)."""

    def __init__(self, views: WorkerViews, router: Router, connections: Gate):
        self._views = views
        self._router = router
        self._metrics = router_metrics(router, connections)
        self._runner: web.AppRunner | None = None
        self._siblings: dict[int, aiohttp.ClientSession] = {}

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._own_metrics)
        app.router.add_get("/reach", self._own_reach)
        app.router.add_get("/traces", self._own_traces)
        app.router.add_get("/traces/{request_id}", self._own_trace)
        app.router.add_get("/usage", self._own_usage)
        app.router.add_get("/rules/stats", self._own_rule_stats)
        app.router.add_get("/scores/{capability}", self._own_scores)
        app.router.add_get("/alerts", self._own_alerts)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        path = self._views.socket(self._views.index)
        await web.UnixSite(self._runner, str(path)).start()  # a dead predecessor's socket file is replaced
        path.chmod(0o600)
        self._siblings = {
            index: aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(self._views.socket(index))),
                                         timeout=SIBLING_TIMEOUT)
            for index in range(self._views.count) if index != self._views.index}

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            # Nothing left behind when the parent was killed outright: the last worker to stop removes the directory.
            self._views.socket(self._views.index).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # not empty: a sibling still runs (or the parent removed it)
                self._views.directory.rmdir()
        for session in self._siblings.values():
            await session.close()

    def handlers(self) -> dict[str, Handler]:
        """The shared port's paths that answer for the whole router."""
        return {"/metrics": self.metrics, "/reach": self.reach, "/traces": self.traces,
                "/traces/{request_id}": self.trace, "/usage": self.usage,
                "/rules/stats": self.rule_stats, "/scores/{capability}": self.scores,
                "/alerts": self.alerts}

    async def metrics(self, request: web.Request) -> web.Response:
        views = {self._views.index: families(self._metrics),
                 **await self._ask_siblings("/metrics", {}, list[Family])}
        merged = merge_metrics(views, SUMMED_GAUGES)
        merged += [GaugeMetricFamily("agentreach_router_workers", "Router worker processes (--workers N)",
                                     value=self._views.count),
                   GaugeMetricFamily("agentreach_router_workers_merged",
                                     "Workers whose counts this answer adds up (one restarting is missing)",
                                     value=len(views))]
        return web.Response(body=generate_latest(Fixed(merged)), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def reach(self, request: web.Request) -> web.Response:
        query = _filters(request, "capability")
        others = await self._ask_siblings("/reach", query, ReachView)
        own = reach_view(self._router, query.get("capability"))
        return json_response(merge_reach(own, others.values()))

    async def traces(self, request: web.Request) -> web.Response:
        query = _traces_query(request)
        others = await self._ask_siblings("/traces", query, list[CallTrace])
        own = self._router.traces.recent(int(query["limit"]), query.get("capability"))
        return json_response({"traces": merge_traces([own, *others.values()], int(query["limit"]))})

    async def trace(self, request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        others = await self._ask_siblings(f"/traces/{quote(request_id, safe='')}", {}, TraceAnswer | None)
        found = newest_trace([found_trace(self._router, request_id), *others.values()])
        if found is None:
            raise trace_not_found(self._router, request_id)
        return json_response(found)

    async def usage(self, request: web.Request) -> web.Response:
        period = usage_period(request)
        views = await self._ask_siblings("/usage", {"period": period, **_filters(request, "client", "capability")},
                                         list[PeriodUsage])
        views[self._views.index] = usage_periods(self._router, request, period)
        return json_response({"period": period, "periods": merge_usage(views)})

    async def rule_stats(self, request: web.Request) -> web.Response:
        query = _filters(request, "capability")
        views = await self._ask_siblings("/rules/stats", query, RuleStats)
        views[self._views.index] = rule_stats_of(self._router, query.get("capability"))
        return json_response(merge_rule_stats(views))

    async def scores(self, request: web.Request) -> web.Response:
        capability = request.match_info["capability"]
        own = scores_of(self._router, capability)  # unknown here: 404 without asking anyone
        views = await self._ask_siblings(f"/scores/{quote(capability, safe='')}", {}, list[InstanceScore])
        views[self._views.index] = own.instances
        return json_response(msgspec.structs.replace(own, instances=label_scores(views)))

    async def alerts(self, request: web.Request) -> web.Response:
        (alerts, reach) = await asyncio.gather(self._ask_siblings("/alerts", {}, AlertsAnswer),
                                               self._ask_siblings("/reach", {}, ReachView))
        index, ledger = self._views.index, self._router.ledger
        alerts[index] = alerts_of(self._router)
        whole = merge_reach(reach_view(self._router, None), reach.values())
        return json_response(merge_alerts(alerts, whole, index, ledger.keep_periods, time.time()))

    async def _own_metrics(self, request: web.Request) -> web.Response:
        return _msgpack(families(self._metrics))

    async def _own_reach(self, request: web.Request) -> web.Response:
        return _msgpack(reach_view(self._router, request.query.get("capability")))

    async def _own_traces(self, request: web.Request) -> web.Response:
        return _msgpack(self._router.traces.recent(int(request.query["limit"]), request.query.get("capability")))

    async def _own_trace(self, request: web.Request) -> web.Response:
        return _msgpack(found_trace(self._router, request.match_info["request_id"]))

    async def _own_usage(self, request: web.Request) -> web.Response:
        return _msgpack(usage_periods(self._router, request, usage_period(request)))

    async def _own_rule_stats(self, request: web.Request) -> web.Response:
        return _msgpack(rule_stats_of(self._router, request.query.get("capability")))

    async def _own_scores(self, request: web.Request) -> web.Response:
        """A capability the registry only now added or removed may be unknown here yet: no rows."""
        found = self._router.choice.scores(request.match_info["capability"])
        return _msgpack(found[1] if found is not None else [])

    async def _own_alerts(self, request: web.Request) -> web.Response:
        return _msgpack(alerts_of(self._router))

    async def _ask_siblings(self, path: str, query: dict[str, str], kind: Any) -> dict[int, Any]:
        """Every live sibling's view at ``path`` decoded as ``kind``, by worker index."""
        answers = await asyncio.gather(*(self._ask(index, session, path, query, kind)
                                         for index, session in self._siblings.items()))
        return {index: answer for index, (gone, answer) in zip(self._siblings, answers, strict=True) if not gone}

    async def _ask(self, index: int, session: aiohttp.ClientSession, path: str, query: dict[str, str],
                   kind: Any) -> tuple[bool, Any]:
        """(True, None) when nobody listens on its socket (it died and is being restarted); else (False, its view)."""
        url = URL("http://worker").with_path(path, encoded=True).with_query(query)
        try:
            async with session.get(url) as response:
                body = await response.read()
        except aiohttp.ClientConnectorError as exc:
            if exc.os_error.errno in GONE:
                return True, None
            raise _unavailable(index, exc) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _unavailable(index, exc) from None
        if response.status != 200:
            raise _unavailable(index, f"answered {response.status}")
        return False, msgspec.msgpack.decode(body, type=kind)
