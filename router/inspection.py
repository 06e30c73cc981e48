"""The router's admin-only inspection endpoints: reach, scores, usage, rule stats, alerts, traces and the
audit trail. Each is a handler reading the router from the app and a pure view of it (``*_of``), which
router/worker_views.py also merges across `--workers N`."""

from __future__ import annotations

import time

from aiohttp import web

from mesh.policy import DEFAULT_POLICY
from router.app_keys import AUDIT_KEY, ROUTER_KEY
from router.audit_query import FilterError, parse_filters
from router.core import Router
from router.merged import AlertsAnswer, RuleStats, Scores, TraceAnswer
from router.reach import ReachView, health_rate
from router.usage import PERIOD_SECONDS, Period, PeriodUsage
from weblayer.errors import ApiError
from weblayer.reading import bounded_int
from weblayer.responses import json_response

MAX_TRACES_LISTED = 1000


def reach_view(router: Router, capability: str | None) -> ReachView:
    states = [state.state for state in router.mirror.states.values()]
    return ReachView(period_seconds=router.ledger.period_seconds,
                     periods=router.ledger.periods(capability, now=time.time()),
                     instance_health_rate=health_rate(states.count("healthy"), len(router.mirror.instances)),
                     route_decisions=dict(router.decisions),
                     semantic=router.semantic.stats() if router.semantic is not None else None)


async def reach(request: web.Request) -> web.Response:
    return json_response(reach_view(request.app[ROUTER_KEY], request.query.get("capability")))


async def scores(request: web.Request) -> web.Response:
    """GET /scores/{capability}: every instance's score under the scored policy, its parts and the figures
    behind them, as this router measured them (each router learns from its own calls)."""
    return json_response(scores_of(request.app[ROUTER_KEY], request.match_info["capability"]))


def scores_of(router: Router, capability: str) -> Scores:
    found = router.choice.scores(capability)
    if found is None:
        raise ApiError(404, "unknown_capability", f"No instance offers capability {capability!r}", "capability")
    policy_name, instances = found
    policy = router.mirror.policy(capability) or DEFAULT_POLICY
    return Scores(capability=capability, policy=policy_name, weights=policy.score_weights,
                  explore_share=policy.exploration, quality_floor=policy.min_quality, instances=instances)


async def usage(request: web.Request) -> web.Response:
    """GET /usage?period=hour|day[&client=ID][&capability=NAME]: calls, tokens and cost this router metered,
    per period kept (oldest first), in all and per client, capability and instance (router/usage.py)."""
    period = usage_period(request)
    return json_response({"period": period, "periods": usage_periods(request.app[ROUTER_KEY], request, period)})


def usage_period(request: web.Request) -> Period:
    period = request.query.get("period", "hour")
    if period not in PERIOD_SECONDS:
        raise ApiError(400, "invalid_field", f"period must be one of {', '.join(PERIOD_SECONDS)}", "period")
    return period


def usage_periods(router: Router, request: web.Request, period: Period) -> list[PeriodUsage]:
    return router.usage.periods(period, request.query.get("client"), request.query.get("capability"))


async def rule_stats(request: web.Request) -> web.Response:
    """Calls each live rule decided and each shadow rule's agreement with the live decisions, on this router."""
    return json_response(rule_stats_of(request.app[ROUTER_KEY], request.query.get("capability")))


def rule_stats_of(router: Router, capability: str | None) -> RuleStats:
    book = router.rules
    return RuleStats(hits=book.hits(capability), shadow=book.shadows(capability),
                     mirror=router.traffic_mirror.stats(capability))


async def alerts(request: web.Request) -> web.Response:
    return json_response(alerts_of(request.app[ROUTER_KEY]))


def alerts_of(router: Router) -> AlertsAnswer:
    return AlertsAnswer(alerts=router.ledger.alerts(time.time()), config=router.ledger.alert_config,
                        rollbacks=list(router.releases.rollbacks), degraded=router.degradations.alerts())


async def traces(request: web.Request) -> web.Response:
    limit = bounded_int(request, "limit", 50, 1, MAX_TRACES_LISTED)
    return json_response({"traces": request.app[ROUTER_KEY].traces.recent(limit, request.query.get("capability"))})


def found_trace(router: Router, request_id: str) -> TraceAnswer | None:
    kept = router.traces
    call = kept.get(request_id)
    return TraceAnswer(call=call, tree=kept.tree(request_id)) if call is not None else None


def trace_not_found(router: Router, request_id: str) -> ApiError:
    return ApiError(404, "trace_not_found", f"No recent call {request_id!r} (the router keeps the last "
                                            f"{router.traces.max_calls})", "request_id")


async def trace(request: web.Request) -> web.Response:
    router, request_id = request.app[ROUTER_KEY], request.match_info["request_id"]
    found = found_trace(router, request_id)
    if found is None:
        raise trace_not_found(router, request_id)
    return json_response(found)


async def audit_entries(request: web.Request) -> web.Response:
    """GET /audit. It flushes first, so a call answered a moment ago is already there: an operator
    chasing an incident must not miss the last half second (admin-only, so nobody else can force
    the extra write, at most one batch)."""
    try:
        filters = parse_filters(request.query)
    except FilterError as exc:
        raise ApiError(400, "invalid_field", exc.message, exc.field) from None
    audit = request.app[AUDIT_KEY]
    await audit.flush()
    return json_response({"entries": await audit.query(filters)})


