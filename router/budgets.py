"""Budgets at one router: a client's spending from its lease of the shared account, a session's token cap.

A client with a budget (its record's ``budget_*``) spends, at each router, from a lease the registry
hands out (mesh/budgets.py). Admission reserves what the call may use and needs the lease to cover it; when
it does not, the router asks the registry for more (one ask at a time per client, its spend so far with
it) and refuses the call with BUDGET_EXHAUSTED, its reset time and Retry-After, once the account has
nothing left. What a call may use is known only when it ends, so admission holds the budget by what it
can know (docs/atp.md "Worst-case overshoot"):
- a call that declares its bound (``context.max_tokens``, ``context.max_cost``) reserves it, and as many such
  calls run at once as the lease covers: they pass the budget only by what they use beyond what they declared;
- a call that declares none reserves an estimate (the largest usage among the client's last ESTIMATE_WINDOW
  calls through this router that reported usage), which its caller can make as small as it likes: so at most
  ``unbounded_calls`` of them (1 unless the operator says more) are in flight at once per client at a router,
  the others waiting their turn. The budget is passed by at most that many calls per router, however many
  calls the client fires at once.

A registry that cannot be reached fails closed past the lease held: the router spends what it was
granted and then refuses (Retry-After a few seconds) until the registry answers again.

A session's cap is the largest ``context.token_budget`` its calls (``context.session_id``, per client)
carried; a call is admitted while what the session's calls through this router used, plus what its calls in
flight reserved, leaves room for its own reservation (its declared bound, or the client's estimate) within it.
Kept per router, in bounded memory: a session whose calls go through several routers is capped at
each of them separately.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from bisect import bisect_left
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import msgspec
from agent_reach.atp import ErrorCode
from agent_reach.exhaustion import Throttle
from agent_reach.headers import API_KEY_HEADER
from agent_reach.usage import MAX_COST, MAX_TOKENS, Usage

from auth.records import ClientRecord
from mesh.budgets import LeaseGrant, LeaseRequest, Limits, cost_amount, limits_of
from router.auth import Refusal

log = logging.getLogger("agentreach.router.budgets")

LeaseBudget = Callable[[str, LeaseRequest], Awaitable[LeaseGrant]]
# After an ask the registry did not answer, calls the lease cannot cover are refused this long without asking.
UNREACHABLE_RETRY_SECONDS = 5
# How often at most the router tells the registry what it spent while no lease runs low (GET /budgets is current).
REPORT_SECONDS = 10.0
# A lease whose account had nothing left is asked again after this long: another router may have given some back (it
# stopped, or was gone past the registry's router-liveness TTL). A truly empty account costs one ask per interval.
DRY_RECHECK_SECONDS = 30.0
# Asks for one call that grant nothing though the account is not dry: past this, the call is refused.
MAX_FRUITLESS_ASKS = 3
# Spend reports (and releases) on their way to the registry at once: one per client with spend would open as
# many connections together, every REPORT_SECONDS.
REPORT_CONCURRENCY = 8
# A call reserves the largest usage among its client's last this many calls that reported usage at this router.
ESTIMATE_WINDOW = 20
# Calls declaring no bound in flight at once per client at a router, unless the operator says otherwise: each may
# pass the budget by its whole usage.
UNBOUNDED_CALLS = 1
# How long at most a call declaring no bound waits for its client's turn (less when its timeout_hint is shorter):
# a caller holding many waiting calls holds them no longer than this.
UNBOUNDED_WAIT_SECONDS = 30.0
# Sessions whose usage is remembered; past this the least recently seen is forgotten (its count starts over).
MAX_SESSIONS = 100_000
# The lease ask latency histogram's buckets (an ask times out after 3 s).
ASK_BOUNDS_MS: tuple[float, ...] = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
_TIMEOUT = aiohttp.ClientTimeout(total=3, sock_connect=1)
_grant_decoder = msgspec.json.Decoder(LeaseGrant)


class LeaseRefused(Exception):
    """The registry answered the lease request, but not with a lease."""


async def lease_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                          client_id: str, request: LeaseRequest) -> LeaseGrant:
    headers = {"Content-Type": "application/json", **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.post(f"{registry_url}/budgets/{client_id}/lease", data=msgspec.json.encode(request),
                            headers=headers, allow_redirects=False, timeout=_TIMEOUT) as response:
        body = await response.read()
        if response.status != 200:
            raise LeaseRefused(f"registry answered {response.status}: {body[:200]!r}")
        return _grant_decoder.decode(body)


# A session as the cap table keeps it: its client and its id's hash, not the id (up to ~4 KB, and 100,000 of them
# are kept; two of a client's sessions whose ids share a 64-bit hash, salted per process, would share a count).
SessionKey = tuple[str, int]


class Ticket(msgspec.Struct, frozen=True, gc=False):
    """What an admitted call holds until it ends: its reservation in its client's lease, and in its session's cap."""

    client_id: str | None = None
    period_start: float = 0.0
    tokens: int = 0
    cost: float = 0.0
    session: SessionKey | None = None
    session_tokens: int = 0
    # It declared no bound on what it spends: it holds one of its client's turns for such calls.
    turn: bool = False
    # The bound it declared, kept to count the calls that used more (None: it declared none for that dimension).
    max_tokens: int | None = None
    max_cost: float | None = None


NO_TICKET = Ticket()


class Bound(msgspec.Struct, frozen=True, gc=False):
    """What a call declared it may use at most (``context.max_tokens``, ``context.max_cost``); None: no bound."""

    tokens: int | None = None
    cost: float | None = None


def bound_of(context: dict[str, Any]) -> Bound:
    """The call's declared bound; the frame was checked before (agent_reach.atp.call_bound_problem)."""
    tokens, cost = context.get("max_tokens"), context.get("max_cost")
    return Bound(tokens=tokens, cost=None if cost is None else float(cost))


def unbounded(limits: Limits, bound: Bound) -> bool:
    """Whether the budget limits a dimension the call declares no bound in: what it may use there is a guess."""
    return (limits.tokens is not None and bound.tokens is None) or (limits.cost is not None and bound.cost is None)


class _Estimate:
    """What a client's next call reserves: the largest usage among its last ESTIMATE_WINDOW calls that reported
    usage here. Not the largest ever: one huge call would reserve its size for every later call for good, so a
    lease with room for hundreds of the client's usual calls would admit a handful at once."""

    __slots__ = ("cost", "recent", "tokens")

    def __init__(self) -> None:
        self.recent: deque[tuple[int, float]] = deque(maxlen=ESTIMATE_WINDOW)
        self.tokens, self.cost = 0, 0.0

    def add(self, tokens: int, cost: float) -> None:
        self.recent.append((tokens, cost))
        self.tokens = max(used for used, _ in self.recent)
        self.cost = max(used for _, used in self.recent)


class _Lease:
    """One client's lease at this router, for one period: cumulative granted and spent, reserved in flight."""

    __slots__ = ("asking", "dry", "dry_until", "estimate", "granted_cost", "granted_tokens", "limits", "others_cost",
                 "others_tokens", "period_start", "reported", "reserved_cost", "reserved_tokens",
                 "reset_at", "retry_at", "spent_cost", "spent_tokens")

    def __init__(self, limits: Limits, estimate: _Estimate):
        self.limits = limits
        self.period_start = 0.0
        self.reset_at = math.inf
        self.granted_tokens, self.granted_cost = 0, 0.0
        self.spent_tokens, self.spent_cost = 0, 0.0
        # What the other routers held of the account at the last grant: their spend, or their lease when larger.
        self.others_tokens, self.others_cost = 0, 0.0
        # The spend the registry was last told of.
        self.reported: tuple[int, float] = (0, 0.0)
        self.reserved_tokens, self.reserved_cost = 0, 0.0
        # What a call reserves; kept from one period to the next (the client's calls are the same size).
        self.estimate = estimate
        # The account had nothing left at the last ask: not asked again before dry_until (wall clock), unless the
        # period resets or the budget changes.
        self.dry = False
        self.dry_until = 0.0
        self.retry_at = 0.0
        self.asking: asyncio.Task[bool] | None = None

    def shortfall(self, tokens_needed: int, cost_needed: float) -> tuple[int, float]:
        """What the lease lacks to cover a call reserving ``tokens_needed`` and ``cost_needed``, per limited
        dimension (0: it covers it). Even a call reserving nothing needs some of the lease left. A lease granted
        under a larger budget is spent only as far as the budget now leaves beside the other routers' part."""
        tokens, cost = 0, 0.0
        if self.limits.tokens is not None:
            usable = min(self.granted_tokens, self.limits.tokens - self.others_tokens)
            left = usable - self.spent_tokens - self.reserved_tokens
            tokens = max(0, max(tokens_needed, 1) - left)
        if self.limits.cost is not None:
            usable_cost = min(self.granted_cost, self.limits.cost - self.others_cost)
            left_cost = usable_cost - self.spent_cost - self.reserved_cost
            cost = max(0.0, cost_amount(max(cost_needed, 1e-9) - left_cost))
        return tokens, cost

    def take(self, grant: LeaseGrant) -> None:
        if grant.period_start != self.period_start:
            # A period this lease has not spent in yet: calls admitted before it are not counted in it.
            self.spent_tokens, self.spent_cost = 0, 0.0
            self.reserved_tokens, self.reserved_cost = 0, 0.0
        self.period_start, self.reset_at = grant.period_start, grant.reset_at
        share = grant.share
        self.granted_tokens, self.granted_cost = share.granted_tokens, share.granted_cost
        self.spent_tokens = max(self.spent_tokens, share.spent_tokens)
        self.spent_cost = max(self.spent_cost, share.spent_cost)
        self.dry = grant.left_tokens == 0 or (grant.left_cost is not None and grant.left_cost <= 0)
        # The account commits, per router, the larger of its grant and its spend: what is left says the others' part.
        if grant.left_tokens is not None and self.limits.tokens is not None:
            held_tokens = max(share.granted_tokens, share.spent_tokens)
            self.others_tokens = max(0, self.limits.tokens - grant.left_tokens - held_tokens)
        if grant.left_cost is not None and self.limits.cost is not None:
            held_cost = max(share.granted_cost, share.spent_cost)
            self.others_cost = max(0.0, self.limits.cost - grant.left_cost - held_cost)


class _Session:
    """A session's cap, what its ended calls used, and what its calls in flight reserved of it."""

    __slots__ = ("cap", "reserved", "used")

    def __init__(self, cap: int):
        self.cap, self.used, self.reserved = cap, 0, 0


def _ask_outcome(request: LeaseRequest, more: bool, dry: bool) -> str:
    """What an answered ask came to: a release or a spend report (it wanted nothing), more granted, nothing
    because the account is dry, or nothing though it is not (callers racing for one lease)."""
    if request.release:
        return "released"
    if not request.want_tokens and not request.want_cost:
        return "reported"
    return "granted" if more else "dry" if dry else "empty"


def _session_cap(context: dict[str, Any]) -> tuple[str, int] | None:
    """The session a call counts toward and the cap it carries; None: it names no session, or no cap."""
    cap = context.get("token_budget")  # first: most calls carry none
    if type(cap) is not int:
        return None
    session_id = context.get("session_id")
    if not isinstance(session_id, str):
        return None
    # Below 0: a nested call whose caller spent more than it had (the SDK sends what is left); nothing is left.
    return session_id, max(cap, 0)


def reset_time(reset_at: float) -> str:
    return datetime.fromtimestamp(reset_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _budget_words(limits: Limits) -> str:
    parts = ([f"{limits.tokens} tokens"] if limits.tokens is not None else []) + \
            ([f"{limits.cost:g} cost"] if limits.cost is not None else [])
    return " and ".join(parts) + f" per {limits.period}"


class Budgets:
    def __init__(self, router_id: str, clients: Callable[[str], ClientRecord | None], *,
                 report_every: float = REPORT_SECONDS, unbounded_calls: int = UNBOUNDED_CALLS,
                 wall_clock: Callable[[], float] = time.time):
        self.router_id = router_id
        self._clients = clients
        self._wall_clock = wall_clock
        # Set by the server: how this router asks the registry for a lease (None: it cannot, budgets fail closed).
        self.lease_budget: LeaseBudget | None = None
        self._leases: dict[str, _Lease] = {}
        # Per client ("" when calls name none): what its next call reserves, of its lease and of its session's cap.
        self._estimates: dict[str, _Estimate] = {}
        self._sessions: OrderedDict[SessionKey, _Session] = OrderedDict()
        # Per client with a budget: its turns for calls declaring no bound (``unbounded_calls`` at once).
        self.unbounded_calls = unbounded_calls
        self._turns: dict[str, asyncio.Semaphore] = {}
        self._unreachable = Throttle()
        self.report_every = report_every
        self.dry_recheck = DRY_RECHECK_SECONDS
        # For /metrics: refusals by their decision; lease asks by outcome, their latency in ASK_BOUNDS_MS buckets.
        self.refusals: Counter[str] = Counter()
        self.asks: Counter[str] = Counter()
        self.ask_buckets = [0] * (len(ASK_BOUNDS_MS) + 1)
        self.ask_seconds = 0.0
        # Calls that used more than the bound they declared (the budget is passed by the excess).
        self.bounds_exceeded = 0

    def applies(self, client_id: str | None, context: dict[str, Any]) -> bool:
        """Whether a call takes from a budget: its client has one, or it names a session and a cap. Most calls
        do not: they are admitted without ``admit``'s coroutines (their ticket: NO_TICKET, which settles nothing)."""
        return _session_cap(context) is not None or \
            (client_id is not None and limits_of(self._clients(client_id)) is not None)

    async def admit(self, client_id: str | None, context: dict[str, Any],
                    wait: float = UNBOUNDED_WAIT_SECONDS) -> Ticket | Refusal:
        """The call's reservation, or why it may not go on: its session's cap, or its client's budget spent, or
        (a call declaring no bound) no turn of its client's came within ``wait`` seconds."""
        admitted = await self._admission(client_id, context, wait)
        if isinstance(admitted, Refusal):
            self.refusals[admitted.decision] += 1
        return admitted

    def unspent(self) -> tuple[int, float]:
        """Tokens and cost this router was granted this period and has not spent (in flight included)."""
        now = self._wall_clock()
        current = [lease for lease in self._leases.values() if lease.period_start and now < lease.reset_at]
        return (sum(max(0, lease.granted_tokens - lease.spent_tokens) for lease in current),
                sum(max(0.0, lease.granted_cost - lease.spent_cost) for lease in current))

    async def _admission(self, client_id: str | None, context: dict[str, Any], wait: float) -> Ticket | Refusal:
        bound = bound_of(context)
        session = self._session(client_id or "", context, bound)
        if isinstance(session, Refusal):
            return session
        try:
            admitted = await self._client_admission(client_id, session, bound, wait)
        except asyncio.CancelledError:  # the caller went away while waiting its turn or for a lease
            self._unreserve(session)
            raise
        if isinstance(admitted, Refusal):
            self._unreserve(session)
        return admitted

    async def _client_admission(self, client_id: str | None, session: Ticket, bound: Bound,
                                wait: float) -> Ticket | Refusal:
        """``session`` (the call's reservation in its session's cap) with the call's reservation in its client's
        lease, or why its client's budget refuses it. A call declaring no bound first takes one of its client's
        turns, held until it ends (``settle``) or released here when it is refused."""
        limits = limits_of(self._clients(client_id)) if client_id is not None else None
        if limits is None:
            return session
        assert client_id is not None
        turn = unbounded(limits, bound)
        if turn:
            turns = self._turns.setdefault(client_id, asyncio.Semaphore(self.unbounded_calls))
            try:
                await asyncio.wait_for(turns.acquire(), wait)
            except TimeoutError:
                return self._no_turn(client_id, wait)
        try:
            admitted = await self._reserved(client_id, limits, session, bound)
        except BaseException:
            if turn:
                self._turns[client_id].release()
            raise
        if isinstance(admitted, Refusal):
            if turn:
                self._turns[client_id].release()
            return admitted
        return msgspec.structs.replace(admitted, turn=turn)

    async def _reserved(self, client_id: str, limits: Limits, session: Ticket, bound: Bound) -> Ticket | Refusal:
        """The call's reservation in its client's lease (asking the registry for more while it lacks), or why it is
        refused: the account has nothing left, or the registry cannot be asked."""
        now = self._wall_clock()
        lease = self._lease(client_id, limits, now)
        need_tokens = (bound.tokens if bound.tokens is not None else lease.estimate.tokens) \
            if limits.tokens is not None else 0
        need_cost = (bound.cost if bound.cost is not None else lease.estimate.cost) if limits.cost is not None else 0.0
        fruitless = 0
        while True:
            tokens, cost = lease.shortfall(need_tokens, need_cost)
            if not tokens and not cost:
                break
            if lease.dry and now <= lease.dry_until:
                return self._exhausted(client_id, lease, now)
            granted = lease.granted_tokens, lease.granted_cost
            if now < lease.retry_at or not await self._renewed(client_id, lease, tokens, cost):
                return self._unreachable_refusal(client_id, lease)
            # An ask grants something or leaves the account dry (callers racing for one lease may need several);
            # a registry answering neither, again and again, is not asked on every call.
            fruitless += (lease.granted_tokens, lease.granted_cost) == granted and not lease.dry
            if fruitless > MAX_FRUITLESS_ASKS:
                lease.retry_at = now + UNREACHABLE_RETRY_SECONDS
                return self._unreachable_refusal(client_id, lease)
        lease.reserved_tokens += need_tokens
        lease.reserved_cost += need_cost
        return msgspec.structs.replace(session, client_id=client_id, period_start=lease.period_start,
                                       tokens=need_tokens, cost=need_cost, max_tokens=bound.tokens,
                                       max_cost=bound.cost)

    def used_fraction(self, client_id: str) -> float | None:
        """How much of the client's budget this period is used as this router knows it (the larger of tokens and
        cost): what the other routers held of the account at this router's last ask or report, plus what this
        router spent. Other routers' unspent leases count as used (about a lease chunk each). None: the client
        has no budget, or this router holds no lease of it yet (it has not admitted a call of it)."""
        limits = limits_of(self._clients(client_id))
        lease = self._leases.get(client_id)
        if limits is None or lease is None or not lease.period_start:
            return None
        if self._wall_clock() >= lease.reset_at:
            return 0.0
        used = ([(lease.others_tokens + lease.spent_tokens) / limits.tokens] if limits.tokens else []) + \
            ([(lease.others_cost + lease.spent_cost) / limits.cost] if limits.cost else [])
        return max(used) if used else None

    def settle(self, ticket: Ticket, usage: Usage | None) -> None:
        """A call ended: its reservation released, what it used spent (nothing known: nothing spent), its turn
        (a call declaring no bound) given to the next call waiting for it."""
        tokens = usage.input_tokens + usage.output_tokens if usage is not None else 0
        cost = (usage.cost or 0.0) if usage is not None else 0.0
        client = ticket.client_id if ticket.client_id is not None else ticket.session[0] if ticket.session else None
        estimate = self._estimates.get(client) if client is not None else None
        if estimate is not None and usage is not None:
            estimate.add(tokens, cost)  # a call that reported nothing says nothing of how large the client's calls are
        if (ticket.max_tokens is not None and tokens > ticket.max_tokens) or \
                (ticket.max_cost is not None and cost_amount(cost - ticket.max_cost) > 0):
            self.bounds_exceeded += 1
        lease = self._leases.get(ticket.client_id) if ticket.client_id is not None else None
        if lease is not None and lease.period_start == ticket.period_start:
            lease.reserved_tokens -= ticket.tokens
            lease.reserved_cost -= ticket.cost
            # Capped at what the registry counts (more than any budget): a spend it refused would never reach it.
            lease.spent_tokens = min(MAX_TOKENS, lease.spent_tokens + tokens)
            lease.spent_cost = min(MAX_COST, lease.spent_cost + cost)
        if ticket.turn and ticket.client_id is not None:
            self._turns[ticket.client_id].release()
        session = self._unreserve(ticket)
        if session is not None:
            session.used += tokens

    def _unreserve(self, ticket: Ticket) -> _Session | None:
        """The ticket's reservation in its session's cap released; the session (None: it names none, or it was
        forgotten meanwhile)."""
        session = self._sessions.get(ticket.session) if ticket.session is not None else None
        if session is not None:
            session.reserved = max(0, session.reserved - ticket.session_tokens)  # forgotten and seen anew meanwhile
        return session

    async def report_forever(self) -> None:
        """Every ``report_every`` seconds, tell the registry what each client spent here since it last heard, so
        its account is current while no lease runs low."""
        while True:
            await asyncio.sleep(self.report_every)
            await self.report()

    async def report(self, *, release: bool = False) -> None:
        """Report the spend the registry has not heard of; ``release`` (the router stops, its calls ended): what
        this router holds unspent goes back too."""
        now = self._wall_clock()
        due = [(client_id, lease) for client_id, lease in self._leases.items()
               if lease.period_start and now < lease.reset_at
               and (release or lease.reported != (lease.spent_tokens, lease.spent_cost))]
        few = asyncio.Semaphore(REPORT_CONCURRENCY)

        async def reported(client_id: str, lease: _Lease) -> None:
            async with few:
                await self._renewed(client_id, lease, 0, 0.0, release)

        await asyncio.gather(*(reported(client_id, lease) for client_id, lease in due))

    def _lease(self, client_id: str, limits: Limits, now: float) -> _Lease:
        """The client's lease for now: a new one once its period ended; a changed budget may be asked again."""
        lease = self._leases.get(client_id)
        if lease is None or now >= lease.reset_at or lease.limits.period != limits.period:
            lease = self._leases[client_id] = _Lease(limits, self._estimates.setdefault(client_id, _Estimate()))
        elif lease.limits != limits:
            lease.limits, lease.dry = limits, False
        return lease

    async def _renewed(self, client_id: str, lease: _Lease, tokens: int, cost: float, release: bool = False) -> bool:
        """Ask the registry for more (callers needing it at once share one ask; an ask already on its way
        reports the spend too); False when it cannot be asked. A release is an ask of its own: it waits for
        the one on its way, which gives nothing back."""
        while release and lease.asking is not None:
            await asyncio.shield(lease.asking)
        if lease.asking is None:
            lease.asking = asyncio.get_running_loop().create_task(self._ask(client_id, lease, tokens, cost, release))
        return await asyncio.shield(lease.asking)

    async def _ask(self, client_id: str, lease: _Lease, tokens: int, cost: float, release: bool) -> bool:
        request = LeaseRequest(router_id=self.router_id, period_start=lease.period_start,
                               spent_tokens=lease.spent_tokens, spent_cost=lease.spent_cost,
                               want_tokens=min(MAX_TOKENS, tokens), want_cost=min(MAX_COST, cost), release=release)
        granted, outcome = (lease.granted_tokens, lease.granted_cost), "failed"
        started = time.monotonic()
        try:
            if self.lease_budget is None:
                raise LeaseRefused("this router has no way to ask the registry for a lease")
            lease.take(await self.lease_budget(client_id, request))
            lease.dry_until = self._wall_clock() + self.dry_recheck
            lease.reported = (request.spent_tokens, request.spent_cost)
            outcome = _ask_outcome(request, granted != (lease.granted_tokens, lease.granted_cost), lease.dry)
            return True
        except Exception as exc:  # the registry away, refusing, answering garbage: the call is refused, not failed
            lease.retry_at = self._wall_clock() + UNREACHABLE_RETRY_SECONDS
            self._unreachable.log(log, logging.WARNING, "budget lease not renewed (or spend not reported): calls "
                                  "past this router's lease are refused", client_id=client_id, error=repr(exc))
            return False
        finally:
            lease.asking = None
            elapsed = time.monotonic() - started
            self.asks[outcome] += 1
            self.ask_buckets[bisect_left(ASK_BOUNDS_MS, elapsed * 1000)] += 1
            self.ask_seconds += elapsed

    def _exhausted(self, client_id: str, lease: _Lease, now: float) -> Refusal:
        return Refusal(code=ErrorCode.BUDGET_EXHAUSTED, decision="budget_exhausted",
                       retry_after=max(1, math.ceil(lease.reset_at - now)), reset_at=reset_time(lease.reset_at),
                       message=f"Client {client_id} has used its budget ({_budget_words(lease.limits)}); it resets "
                               f"at {reset_time(lease.reset_at)}")

    def _no_turn(self, client_id: str, wait: float) -> Refusal:
        return Refusal(code=ErrorCode.BUSY, decision="budget_turn_timeout", retry_after=1,
                       message=f"Client {client_id} has a budget: its calls that declare no context.max_tokens (or "
                               f"max_cost) go {self.unbounded_calls} at a time through a router, and none ended "
                               f"within {wait:g} s; declare a bound to run calls at once")

    def _unreachable_refusal(self, client_id: str, lease: _Lease) -> Refusal:
        return Refusal(code=ErrorCode.BUDGET_EXHAUSTED, decision="budget_unconfirmed",
                       retry_after=UNREACHABLE_RETRY_SECONDS,
                       message=f"Client {client_id} has used this router's lease of its budget and the registry "
                               "cannot be asked for more now; retry shortly")

    def _session(self, client_id: str, context: dict[str, Any], bound: Bound) -> Ticket | Refusal:
        """The call's reservation in the cap of the session it counts toward (NO_TICKET: it names no session and
        cap), or why it is refused. It reserves its declared ``max_tokens``, or else its client's estimate: calls
        of one session in flight at once pass the cap only by what they use beyond it."""
        capped = _session_cap(context)
        if capped is None:
            return NO_TICKET
        session_id, cap = capped
        key = (client_id, hash(session_id))
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(cap)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
            # The session's own budget: nested calls carry what their caller has left, which must not lower it.
            session.cap = max(session.cap, cap)
        estimate = self._estimates.setdefault(client_id, _Estimate()).tokens if bound.tokens is None else bound.tokens
        if session.used + session.reserved + max(estimate, 1) > session.cap:
            return Refusal(code=ErrorCode.BUDGET_EXHAUSTED, decision="session_budget_exhausted",
                           message=f"Session {session_id!r} has used its token_budget ({session.used} of "
                                   f"{session.cap} tokens through this router, {session.reserved} more reserved by "
                                   "its calls in flight)")
        session.reserved += estimate
        return Ticket(session=key, session_tokens=estimate)
