"""Which connections a listener keeps: at most ``max_connections`` at once, at most
``max_connections_per_peer`` from one client address, and near the cap the slow ones go first.

A connection counts from the moment it is accepted (``accepted`` until asyncio gives it a handler, a loop
turn later), so however many are accepted in one go, no more than the cap hold descriptors. Refusing
alone let a flood of slow connections shut every caller out (600 slowloris connections a server: 85 of
135 normal calls failed), so from ``shed_from`` of the cap on, each connection accepted closes the one
that has waited longest on its client: idle between requests, or with its request's header or body still
arriving. A connection whose request the server is handling is never closed for room. Past its address's
share a new connection is refused whatever room is left, so one address cannot hold them all.
"""

from __future__ import annotations

import enum
import logging
import resource
from collections import Counter
from typing import Protocol

import msgspec

from agent_reach.exhaustion import Throttle

log = logging.getLogger("agentreach.connections")

# Connections one address may hold when the cap is small: a router, a console or a pool of agents on one host
# opens dozens at once.
MIN_PER_PEER = 64


def default_max_connections() -> int:
    """A quarter of the descriptors this process may open: the mesh runs up to three servers in one
    process (`agentreach up`), and each keeps the rest for outgoing calls, the WAL and databases."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 16_384 if soft == resource.RLIM_INFINITY else max(16, soft // 4)


def default_max_connections_per_peer() -> int:
    """A quarter of the default cap, at least MIN_PER_PEER: an attacker needs several addresses to fill it."""
    return max(MIN_PER_PEER, default_max_connections() // 4)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    # Longer than any pool in the mesh keeps an idle connection (the router's is 30 s, aiohttp's 15 s),
    # so a client never sends on a connection the server is closing.
    idle_timeout: float = 75.0
    max_connections: int = msgspec.field(default_factory=default_max_connections)
    # Connections one client address may hold at once; 0: no limit (behind a proxy every caller has its address).
    max_connections_per_peer: int = msgspec.field(default_factory=default_max_connections_per_peer)
    # The share of the cap from which each new connection closes the slowest one to make room.
    shed_from: float = 0.9


class Admission(enum.Enum):
    ADMIT = "admit"
    FULL = "cap"  # refused: the listener holds its cap
    PEER_FULL = "peer"  # refused: the connection's address holds its share


def admission(held: int, leaving: int, from_peer: int, *, limit: int, per_peer: int,
              shed_at: int) -> tuple[Admission, bool]:
    """What becomes of a connection just accepted, and whether a slow one is to be closed for room.
    ``held``: connections holding a descriptor, ``leaving`` of them already being closed for room;
    ``from_peer``: those from the new connection's address. A refusal at the cap still makes room, for the
    retry; one past its address's share does not (it is the address's own doing)."""
    if per_peer and from_peer >= per_peer:
        return Admission.PEER_FULL, False
    return (Admission.FULL if held >= limit else Admission.ADMIT), held - leaving >= shed_at


def shed_threshold(limit: int, share: float) -> int:
    """From how many connections on slow ones are closed for room: below the cap, so the room is made
    before a caller is refused."""
    return max(0, min(limit - 1, int(limit * share)))


class Connection(Protocol):
    """A connection the gate may close to make room."""

    def shed(self) -> None: ...


class Gate:
    """A listener's connections against its limits, and what became of them (for /metrics); refusals and
    closings reported once per interval."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.limit = limits.max_connections
        self.per_peer = limits.max_connections_per_peer
        self.shed_at = shed_threshold(self.limit, limits.shed_from)
        self.open = 0
        self.accepted = 0
        self.refused = 0  # at the cap
        self.refused_peer = 0  # past an address's share
        self.shed = 0  # closed to make room
        # Callers that left mid-request: a header, body or answer unfinished.
        self.hang_ups = 0
        # Per address: accepted and waiting for a handler (and by descriptor, the address it came from), and open.
        self._arriving: Counter[str] = Counter()
        self._arriving_from: dict[int, str] = {}
        self._open_by: Counter[str] = Counter()
        # Connections waiting on their client, the longest waiting first (each moves to the end as it starts
        # waiting again); those closed for room until they are gone.
        self._waiting: dict[Connection, None] = {}
        self._leaving: set[Connection] = set()
        self._throttles = {reason: Throttle() for reason in ("cap", "peer", "shed", "hang_up")}

    def admit(self, peer: str, descriptor: int) -> Admission:
        """Whether a connection just accepted from ``peer`` may stay, or why not; a slow one may be closed to
        make room."""
        verdict, make_room = admission(self.open + self.accepted, len(self._leaving),
                                       self._arriving[peer] + self._open_by[peer], limit=self.limit,
                                       per_peer=self.per_peer, shed_at=self.shed_at)
        if make_room and self._waiting:
            self._shed_longest_waiting()
        if verdict is Admission.ADMIT:
            self.accepted += 1
            self._arriving[peer] += 1
            self._arriving_from[descriptor] = peer
        elif verdict is Admission.FULL:
            self.refuse()
        else:
            self.refused_peer += 1
            self._throttles["peer"].log(log, logging.WARNING, "connections refused: one address holds its share",
                                        remote=peer, per_peer=self.per_peer)
        return verdict

    def take(self) -> bool:
        """Whether the next connection gets a handler (which counts itself open). One admitted at accept
        always does; a loop that accepts on its own (uvloop) bypasses ``admit``, so the cap is checked here
        (only the cap: no address is known yet, and no room is made)."""
        if self.accepted:
            self.accepted -= 1
            return True
        if self.open < self.limit:
            return True
        self.refuse()
        return False

    def refuse(self) -> None:
        self.refused += 1
        self._throttles["cap"].log(log, logging.ERROR, "connection cap reached; refusing new connections",
                                   open=self.open, limit=self.limit)

    def entered(self, descriptor: int, peer: str | None) -> str | None:
        """A connection's handler has it: from here on it counts as open for the address it was admitted from
        (``peer``, as its transport saw it, when the loop accepted it past ``admit``), which is returned."""
        admitted_from = self._arriving_from.pop(descriptor, None)
        if admitted_from is not None:
            peer = admitted_from
            self._arriving[peer] -= 1
            if not self._arriving[peer]:
                del self._arriving[peer]
        if peer is not None:
            self._open_by[peer] += 1
        return peer

    def waits(self, connection: Connection) -> None:
        """``connection`` waits on its client from now on: for a request, or for the rest of one."""
        if connection not in self._leaving:
            self._waiting.pop(connection, None)
            self._waiting[connection] = None

    def busy(self, connection: Connection) -> None:
        """``connection``'s request is the server's to answer: not to be closed for room."""
        self._waiting.pop(connection, None)

    def left(self, connection: Connection, peer: str | None) -> None:
        self.open -= 1
        self._waiting.pop(connection, None)
        self._leaving.discard(connection)
        if peer is not None:
            self._open_by[peer] -= 1
            if not self._open_by[peer]:
                del self._open_by[peer]

    def hung_up(self, remote: object) -> None:
        """A caller left mid-request: counted, and reported once per interval with how many did."""
        self.hang_ups += 1
        self._throttles["hang_up"].log(log, logging.INFO, "callers left mid-request", remote=remote)

    def _shed_longest_waiting(self) -> None:
        connection = next(iter(self._waiting))
        del self._waiting[connection]
        self._leaving.add(connection)
        self.shed += 1
        self._throttles["shed"].log(log, logging.WARNING, "slow connections closed to make room near the "
                                    "connection cap", open=self.open, limit=self.limit)
        connection.shed()
