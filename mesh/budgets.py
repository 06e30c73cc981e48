"""Client budgets shared by every router: the account the registry keeps, the leases it hands out.

A client's budget (tokens and/or cost per hour, day or month, UTC) is one account per client at the
registry. Routers never hold the whole budget: each asks for a *lease* (a chunk), spends from it
locally and asks again when it runs low, reporting its spend so far with each ask. The account holds,
per router, what it was granted and what it reported spent, both cumulative for the period, so an
ask repeated after a lost answer changes nothing twice. What is committed is, per router, the larger
of the two: a router that spent past its lease (a call's usage is known only once it ended) eats into
what the others can still get. Everything here is pure; the registry (registry/budgets.py) stores
the account and the router (router/budgets.py) spends the lease.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Annotated

import msgspec
from agent_reach.usage import MAX_COST

from auth.records import BudgetPeriod, ClientRecord

BUDGET_PREFIX = "budgets/"
# What one ask gets at least: this share of the budget. Small enough that routers which stop asking
# (dead, or idle) strand little of it; large enough that a router asks ~20 times a period, not per call.
LEASE_SHARE = 0.05
# Costs are sums of floats, and 0.1 + 0.1 + 0.1 > 0.3: amounts of cost are compared at this many decimals, so a
# budget of 0.3 admits three calls of 0.1 (prices are unit-free; a billionth of a unit is below any price's grain).
COST_DIGITS = 9
RouterId = Annotated[str, msgspec.Meta(pattern=r"^[!-~]{1,128}\Z")]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]
Cost = Annotated[float, msgspec.Meta(ge=0, le=MAX_COST)]


class Limits(msgspec.Struct, frozen=True):
    """A client's budget as its record states it; a dimension None is not limited."""

    tokens: int | None
    cost: float | None
    period: BudgetPeriod


def limits_of(record: ClientRecord | None) -> Limits | None:
    """The client's budget; None when it has none (or no such client)."""
    if record is None or record.budget_period is None:
        return None
    return Limits(record.budget_tokens, record.budget_cost, record.budget_period)


def budget_problem(tokens: int | None, cost: float | None, period: BudgetPeriod | None) -> tuple[str, str] | None:
    """(field, why) when a budget's parts do not fit together: a budget needs its period and a period its budget."""
    if period is None and (tokens is not None or cost is not None):
        return "budget_period", "a budget needs budget_period: hour, day or month"
    if period is not None and tokens is None and cost is None:
        return "budget_period", "budget_period needs budget_tokens or budget_cost"
    return None


def period_bounds(period: BudgetPeriod, now: float) -> tuple[float, float]:
    """The calendar period (UTC) holding ``now``: its start and the moment it resets."""
    moment = datetime.fromtimestamp(now, UTC)
    if period == "hour":
        start = moment.replace(minute=0, second=0, microsecond=0)
        end = start + timedelta(hours=1)
    elif period == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + timedelta(days=1)
    else:
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return start.timestamp(), end.timestamp()


class RouterShare(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One router's part of a period's account, cumulative: what it was granted and reported spent."""

    granted_tokens: int = 0
    granted_cost: float = 0.0
    spent_tokens: int = 0
    spent_cost: float = 0.0


class BudgetAccount(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Stored at ``budgets/{client_id}/account``: a client's spending in its current period."""

    client_id: str
    period: BudgetPeriod
    period_start: float
    routers: dict[str, RouterShare] = {}


class LeaseRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """The body of POST /budgets/{client_id}/lease: a router's spend so far this period and what it needs."""

    router_id: RouterId
    # The period the spend belongs to (0: the router has none yet); spend from an ended period is dropped.
    period_start: float = 0.0
    spent_tokens: Tokens = 0
    spent_cost: Cost = 0.0
    # What it lacks to admit its next call; none (0 in every dimension): it only reports its spend.
    want_tokens: Tokens = 0
    want_cost: Cost = 0.0
    # The router stops: what it was granted beyond what it spent goes back to the account.
    release: bool = False


class LeaseGrant(msgspec.Struct, kw_only=True, frozen=True):
    """The answer to a lease request: the router's whole share so far and what the account has left."""

    client_id: str
    period: BudgetPeriod
    period_start: float
    reset_at: float
    share: RouterShare
    # Uncommitted after this grant, per limited dimension (None: not limited): at 0 nobody gets more.
    left_tokens: int | None
    left_cost: float | None


class BudgetView(msgspec.Struct, kw_only=True):
    """GET /budgets/{client_id}: the budget, what routers reported spent and hold, per router."""

    client_id: str
    period: BudgetPeriod
    period_start: float
    reset_at: float
    budget_tokens: int | None
    budget_cost: float | None
    spent_tokens: int
    spent_cost: float
    committed_tokens: int
    committed_cost: float
    routers: dict[str, RouterShare]


def account_key(client_id: str) -> str:
    return f"{BUDGET_PREFIX}{client_id}/account"


def client_of(key: str) -> str | None:
    """The client an account key belongs to; None for any other key."""
    if key.startswith(BUDGET_PREFIX) and key.endswith("/account"):
        return key[len(BUDGET_PREFIX):-len("/account")]
    return None


def current(account: BudgetAccount | None, client_id: str, limits: Limits, now: float) -> BudgetAccount:
    """The account for the period holding ``now``: a new, empty one once the stored one's period ended."""
    start, _ = period_bounds(limits.period, now)
    if account is None or account.period != limits.period or account.period_start != start:
        return BudgetAccount(client_id=client_id, period=limits.period, period_start=start)
    return account


def cost_amount(value: float) -> float:
    """``value`` at the precision budgets count cost in (COST_DIGITS)."""
    return round(value, COST_DIGITS)


def committed(account: BudgetAccount) -> tuple[int, float]:
    """Tokens and cost no router may be granted again: per router, the larger of granted and spent."""
    tokens = sum(max(share.granted_tokens, share.spent_tokens) for share in account.routers.values())
    cost = sum(max(share.granted_cost, share.spent_cost) for share in account.routers.values())
    return tokens, cost_amount(cost)


def _given_back(share: RouterShare) -> RouterShare:
    """The share once what it was granted beyond its spend went back to the account (committed := spent)."""
    return msgspec.structs.replace(share, granted_tokens=share.spent_tokens, granted_cost=share.spent_cost)


def holding(account: BudgetAccount) -> list[str]:
    """The routers granted more of the account than they spent: what they hold unspent nobody else may get."""
    return [router_id for router_id, share in account.routers.items()
            if share.granted_tokens > share.spent_tokens or share.granted_cost > share.spent_cost]


def given_back(account: BudgetAccount, router_ids: Collection[str]) -> BudgetAccount:
    """The account once ``router_ids`` (gone) gave back what they held unspent; the same account when they held
    nothing, so giving back twice changes nothing."""
    routers = {router_id: _given_back(share) if router_id in router_ids else share
               for router_id, share in account.routers.items()}
    return account if routers == account.routers else msgspec.structs.replace(account, routers=routers)


def _given(budget: float | None, used: float, want: float, chunk: float) -> float:
    """What one ask gets of a limited dimension: a chunk (or what it wants, if more), never past the budget;
    nothing when it wants none."""
    if budget is None or want <= 0:
        return 0
    return max(0, min(max(chunk, want), cost_amount(budget - used)))


def lease(account: BudgetAccount, limits: Limits, request: LeaseRequest) -> tuple[BudgetAccount, LeaseGrant]:
    """The account after ``request`` (its spend recorded, a chunk granted, or its unspent grant given back)
    and the answer to it."""
    share = account.routers.get(request.router_id, RouterShare())
    if request.period_start == account.period_start:
        share = msgspec.structs.replace(share, spent_tokens=max(share.spent_tokens, request.spent_tokens),
                                        spent_cost=max(share.spent_cost, request.spent_cost))
    if request.release:
        share = _given_back(share)
    routers = {**account.routers, request.router_id: share}
    used_tokens, used_cost = committed(msgspec.structs.replace(account, routers=routers))
    # Committing the grant adds to the router's committed part only what its grant passes its spend by.
    tokens = int(_given(limits.tokens, used_tokens, request.want_tokens, math.ceil((limits.tokens or 0) * LEASE_SHARE)))
    cost = float(_given(limits.cost, used_cost, request.want_cost, (limits.cost or 0.0) * LEASE_SHARE))
    share = msgspec.structs.replace(share, granted_tokens=max(share.granted_tokens, share.spent_tokens) + tokens,
                                    granted_cost=max(share.granted_cost, share.spent_cost) + cost)
    after = msgspec.structs.replace(account, routers={**account.routers, request.router_id: share})
    left_tokens, left_cost = committed(after)
    _, reset_at = period_bounds(limits.period, account.period_start)
    return after, LeaseGrant(
        client_id=account.client_id, period=account.period, period_start=account.period_start, reset_at=reset_at,
        share=share, left_tokens=None if limits.tokens is None else max(0, limits.tokens - left_tokens),
        left_cost=None if limits.cost is None else max(0.0, cost_amount(limits.cost - left_cost)))


def view(account: BudgetAccount, limits: Limits) -> BudgetView:
    tokens, cost = committed(account)
    _, reset_at = period_bounds(limits.period, account.period_start)
    return BudgetView(client_id=account.client_id, period=account.period, period_start=account.period_start,
                      reset_at=reset_at, budget_tokens=limits.tokens, budget_cost=limits.cost,
                      spent_tokens=sum(share.spent_tokens for share in account.routers.values()),
                      spent_cost=sum(share.spent_cost for share in account.routers.values()),
                      committed_tokens=tokens, committed_cost=cost, routers=account.routers)
