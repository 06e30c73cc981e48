"""One instance of a capability as the router sees it at the moment of a call, and the score the scored policy
gives it: the shape selection (router/selection.py) filters and orders and scoring (router/scoring.py)
weighs, kept apart so that each imports it one way."""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.atp import ScoreParts
from agent_reach.registration import Protocol

from router.measurements import Measured


class Score(msgspec.Struct, kw_only=True, frozen=True):
    """One instance's score for one call; ``explored``: it goes first as an exploration pick, not on merit."""

    total: float
    parts: ScoreParts
    explored: bool = False


class Candidate(msgspec.Struct, kw_only=True):
    """One instance of the capability as the router sees it at the moment of the call."""

    agent_id: str
    endpoint: str
    protocol: Protocol
    # "healthy", "pending" or "demoted" as the registry's feed says it: plain text on the wire, so a state a
    # newer registry adds is carried (and never routed to) rather than failing the feed.
    state: str
    load: float = 0.0  # reported by the agent, 0..1
    inflight: int = 0  # router-side in-flight calls right now
    metadata: dict[str, Any] = {}  # zone, env, team, model, max_qps, routing_policy, ...
    max_qps: float = 0.0  # 0 = unlimited
    available: bool = True  # False: breaker open or passively ejected (the I/O side decides)
    has_capacity: bool = True  # False: its max_qps token bucket is empty right now
    version: str = ""  # its version of the capability (agent_reach.versions.instance_version)
    # What the scored policy weighs (router/scoring.py): this router's figures (None: never measured), the price
    # of a reference call (None: none declared), the quality posted for it (None: none), the capability's SLA;
    # ``score`` is set by the scored order.
    measured: Measured | None = None
    cost: float | None = None
    quality: float | None = None
    sla_ms: int = 30_000
    score: Score | None = None
