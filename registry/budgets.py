"""Client budgets at the registry: each client's account for its period, and the leases routers ask for.

The accounts are records in the store (``budgets/{client_id}/account``, mesh/budgets.py), so they
survive a restart and are shared by registry nodes on one etcd: an ask is a read-change-write done
with ``put_if_unchanged`` on the account's key, retried when another node wrote it first. They are
not part of the routers' mirrored key space (a router needs only its own lease, not every account).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Collection, Iterator
from functools import partial
from typing import TypeVar

import msgspec
from agent_reach.exhaustion import Throttle

from auth.records import BudgetPeriod
from mesh.budgets import (
    BUDGET_PREFIX,
    BudgetAccount,
    BudgetView,
    LeaseGrant,
    LeaseRequest,
    Limits,
    account_key,
    budget_problem,
    client_of,
    committed,
    current,
    given_back,
    holding,
    lease,
    limits_of,
    view,
)
from mesh.records import encode_value
from registry.state import RegistryState
from registry.store import Change, Store
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.budgets")

_account_decoder = msgspec.msgpack.Decoder(BudgetAccount)
# GET /budgets: the most accounts one answer holds (and the page size when none is asked for).
MAX_ACCOUNTS_LISTED = 1000
# The router-liveness TTL: a router not live (no watch stream open at any registry node) this long gives back what it
# was granted this period and did not spend. A router id is new with every process, so a killed router never comes
# back for its lease; a live one moving to another registry node is away for seconds, well under this.
ROUTER_GONE_SECONDS = 30.0
# How often the leader looks for routers gone, as a share of the TTL.
RECLAIM_CHECKS_PER_TTL = 6
Result = TypeVar("Result")


class BudgetPage(msgspec.Struct, kw_only=True):
    """A page of GET /budgets; ``next_after`` is the ``after`` of the next page, None on the last."""

    budgets: list[BudgetView]
    next_after: str | None


def check_budget(tokens: int | None, cost: float | None, period: BudgetPeriod | None) -> None:
    """A 400 naming the field when a budget's parts do not fit together."""
    problem = budget_problem(tokens, cost, period)
    if problem is not None:
        raise ApiError(400, "invalid_field", problem[1], problem[0])


def _given_back_by(routers: Collection[str], account: BudgetAccount) -> tuple[BudgetAccount, None]:
    return given_back(account, routers), None


class Budgets:
    def __init__(self, store: Store, state: RegistryState, wall_clock: Callable[[], float]):
        self._store = store
        self._state = state
        self._wall_clock = wall_clock
        self._accounts: dict[str, BudgetAccount] = {}
        for key, value in store.snapshot().items():
            self._apply(Change(key, value))
        self.close = store.watch(self._apply)
        # One ask at a time per account in this process (asks for other clients share the log's group commits,
        # as every lease of every client runs out together when a period begins); across nodes sharing etcd,
        # put_if_unchanged decides.
        self._locks: dict[str, asyncio.Lock] = {}
        self.router_gone_seconds = ROUTER_GONE_SECONDS
        # Routers holding an unspent grant this period and not live: since when (monotonic), while this node leads.
        self._absent_since: dict[str, float] = {}
        self._reclaim_failures = Throttle()

    def _apply(self, change: Change) -> None:
        client_id = client_of(change.key)
        if client_id is None:
            return
        if change.value is None:
            self._accounts.pop(client_id, None)
        else:
            self._accounts[client_id] = _account_decoder.decode(change.value)

    def _limits(self, client_id: str) -> Limits:
        record = self._state.auth.clients.get(client_id)
        if record is None:
            raise ApiError(404, "client_not_found", f"No client {client_id!r}", "client_id")
        limits = limits_of(record)
        if limits is None:
            raise ApiError(404, "no_budget", f"Client {client_id!r} has no budget", "client_id")
        return limits

    def tally(self) -> tuple[int, int]:
        """For /metrics: clients with a budget (each has an account this period), and those whose account has
        nothing left to lease (their calls are refused once the routers spent their leases)."""
        now = self._wall_clock()
        accounts = exhausted = 0
        for client_id, limits in self._budgeted():
            accounts += 1
            tokens, cost = committed(current(self._accounts.get(client_id), client_id, limits, now))
            exhausted += (limits.tokens is not None and tokens >= limits.tokens) or \
                (limits.cost is not None and cost >= limits.cost)
        return accounts, exhausted

    def _budgeted(self) -> Iterator[tuple[str, Limits]]:
        """Each client with a budget, and its budget."""
        for client_id, record in self._state.auth.clients.items():
            limits = limits_of(record)
            if limits is not None:
                yield client_id, limits

    def accounts(self, after: str, limit: int) -> BudgetPage:
        """GET /budgets: the accounts of the budgeted clients whose ids sort after ``after``, at most ``limit``
        of them in id order, so a listing of many budgets is read in bounded pages."""
        now = self._wall_clock()
        page = heapq.nsmallest(limit + 1, ((client_id, limits) for client_id, limits in self._budgeted()
                                           if client_id > after), key=lambda budgeted: budgeted[0])
        views = [view(current(self._accounts.get(client_id), client_id, limits, now), limits)
                 for client_id, limits in page[:limit]]
        return BudgetPage(budgets=views, next_after=views[-1].client_id if len(page) > limit else None)

    def account(self, client_id: str) -> BudgetView:
        limits = self._limits(client_id)
        return view(current(self._accounts.get(client_id), client_id, limits, self._wall_clock()), limits)

    async def _change(self, client_id: str, limits: Limits,
                      change: Callable[[BudgetAccount], tuple[BudgetAccount, Result]]) -> tuple[bool, Result]:
        """Apply ``change`` to the client's current account and store it (whether it changed, and what ``change``
        said); nothing is written when it changes nothing."""
        key = account_key(client_id)
        async with self._locks.setdefault(client_id, asyncio.Lock()):
            while True:
                since = self._store.revision
                stored = self._accounts.get(client_id)
                account, result = change(current(stored, client_id, limits, self._wall_clock()))
                if account == stored:
                    return False, result
                # Another registry node may have changed this account since memory was read: read again then.
                if await self._store.put_if_unchanged(key, encode_value(account), since,
                                                      [f"{BUDGET_PREFIX}{client_id}/"]) is not None:
                    return True, result

    async def lease(self, client_id: str, request: LeaseRequest) -> LeaseGrant:
        """Record a router's spend and grant it a chunk of what is left (nothing once the budget is committed)."""
        limits = self._limits(client_id)
        changed, grant = await self._change(client_id, limits, lambda account: lease(account, limits, request))
        if not changed:
            return grant
        log.info("budget lease", extra={"client_id": client_id, "router_id": request.router_id,
                                        "granted_tokens": grant.share.granted_tokens,
                                        "left_tokens": grant.left_tokens, "left_cost": grant.left_cost})
        return grant

    async def reclaim_forever(self, live: Callable[[], Collection[str]], leads: Callable[[], bool]) -> None:
        """While this node leads (the sole node always does): give back the unspent grants of routers gone longer
        than the router-liveness TTL, so a killed router strands nothing past it."""
        while True:
            await asyncio.sleep(self.router_gone_seconds / RECLAIM_CHECKS_PER_TTL)
            if not leads():
                self._absent_since.clear()  # a node that takes the lead later counts absences from then
                continue
            try:
                await self.reclaim(live())
            except Exception as exc:  # the store refusing writes: the next look tries again
                self._reclaim_failures.log(log, logging.ERROR, "unspent budget of gone routers not given back yet",
                                           error=repr(exc))

    async def reclaim(self, live: Collection[str]) -> None:
        """One look: the routers holding an unspent grant this period that are not live are noted, and those gone
        for the TTL give it back, one stored write per account they hold part of."""
        now, moment = time.monotonic(), self._wall_clock()
        held = {client_id: (limits, routers) for client_id, limits in self._budgeted()
                if (stored := self._accounts.get(client_id)) is not None
                and current(stored, client_id, limits, moment) is stored and (routers := holding(stored))}
        absent = {router_id for _, routers in held.values() for router_id in routers} - set(live)
        self._absent_since = {router_id: self._absent_since.get(router_id, now) for router_id in absent}
        gone = {router_id for router_id, since in self._absent_since.items()
                if now - since >= self.router_gone_seconds}
        for client_id, (limits, routers) in held.items():
            returning = gone.intersection(routers)
            if returning and (await self._change(client_id, limits, partial(_given_back_by, returning)))[0]:
                log.info("budget held by gone routers given back", extra={"client_id": client_id,
                                                                          "routers": sorted(returning)})
