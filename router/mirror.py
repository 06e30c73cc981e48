"""The router's copy of registry state, built from watch events; the call path reads only this.

The router never asks the registry per call: it follows the registry's watch feed (in process or
over HTTP) and keeps routing on its last view when the feed is interrupted. The feed also says
which routers are live, and so this router's share of every limit.
"""

from __future__ import annotations

import asyncio
import os
import socket

import msgspec
from agent_reach.registration import Capability
from agent_reach.versions import instance_version

from auth.book import AuthBook
from mesh.alerts import AlertConfig
from mesh.keyspace import KeySpace
from mesh.policy import Policy
from mesh.records import InstanceRecord, instance_id
from mesh.watch import Delete, InstanceState, Ping, Put, Reset, Routers, States, WatchEvent
from router.ratelimit import limit_share

UNKNOWN_STATE = InstanceState("pending", 0.0, None)


class Offer(msgspec.Struct, frozen=True):
    """One instance offering one capability, as the router sees it right now."""

    record: InstanceRecord
    capability: Capability
    state: InstanceState
    version: str  # the instance's version of this capability (agent_reach.versions.instance_version)


def new_offer(record: InstanceRecord, capability: Capability, state: InstanceState) -> Offer:
    """The offer with its version worked out once, as the feed changes, rather than per candidate per call."""
    return Offer(record, capability, state, instance_version(capability.version, record.metadata.get("semver")))


def new_router_id() -> str:
    """Unique per router process (a restarted router is a new member; the old id leaves with its stream),
    and always a valid id on the feed (mesh.watch.valid_router_id), whatever the host is called."""
    host = "".join(char for char in socket.gethostname() if "!" <= char <= "~")[:64] or "router"
    return f"{host}-{os.getpid()}-{os.urandom(3).hex()}"


class RegistryMirror:
    def __init__(self, router_id: str | None = None) -> None:
        """``router_id``: how this router announces itself on the feed (made up when not given)."""
        self.router_id = router_id or new_router_id()
        # The live routers (this one always among them) and this router's share of every limit.
        self.routers = frozenset({self.router_id})
        self.limit_share = 1.0
        self.revision = 0
        self.synced = False
        self.keys = KeySpace()
        self.states: dict[str, InstanceState] = {}
        # offers() answers per capability, built on first use after any change; never mutate them.
        self._offer_lists: dict[str, list[Offer]] = {}
        self._changed = asyncio.Event()
        self.changes = 0  # counts the changes next_change reports: what is derived from the view is keyed by it

    @property
    def instances(self) -> dict[str, InstanceRecord]:
        """The instances that take calls (evicted ones are left out)."""
        return self.keys.live

    @property
    def alerts(self) -> AlertConfig | None:
        """The stored alert settings; None while none are stored, and the router judges by its own."""
        return self.keys.alerts

    @property
    def auth(self) -> AuthBook:
        return self.keys.auth

    def apply(self, event: WatchEvent) -> None:
        if isinstance(event, Routers):
            self._routers(event)
            return
        if not isinstance(event, Ping):
            self._offer_lists.clear()
            self.changes += 1
            self._changed.set()
            self._changed = asyncio.Event()
        if isinstance(event, Reset):
            self._reset(event)
        elif isinstance(event, Put):
            self.keys.put(event.key, event.value)
            self._forget_state(event.key)
            self.revision = event.revision
        elif isinstance(event, Delete):
            self.keys.delete(event.key)
            self._forget_state(event.key)
            self.revision = event.revision
        elif isinstance(event, States):
            self.states.update(event.states)
        elif isinstance(event, Ping):
            pass

    async def next_change(self) -> None:
        """Returns once records or instance states change (not on pings or router lists): for watchers that
        re-derive something from the view, such as an MCP session's tool list, without polling it."""
        await self._changed.wait()

    def _reset(self, event: Reset) -> None:
        self.keys = KeySpace()
        for key, value in event.records.items():
            self.keys.put(key, value)
        self.states = dict(event.states)
        self.revision = event.revision
        self.synced = True

    def _routers(self, event: Routers) -> None:
        """Kept across resets and breaks in the feed: the last word on who else is live. This router
        counts even before the registry has heard of it, so its share is never above its due."""
        self.routers = frozenset(event.routers) | {self.router_id}
        self.limit_share = limit_share(len(self.routers))

    def _forget_state(self, key: str) -> None:
        """A changed instance record starts over (pending) until the registry sends its state again."""
        agent_id = instance_id(key)
        if agent_id is not None:
            self.states.pop(agent_id, None)

    def offers(self, capability: str) -> list[Offer] | None:
        """Every instance offering ``capability``; None when no instance does (unknown capability)."""
        cached = self._offer_lists.get(capability)
        if cached is not None:
            return cached
        found = self.keys.offers.get(capability)
        if not found:
            return None
        built = self._offer_lists[capability] = [
            new_offer(self.keys.live[agent_id], offered, self.states.get(agent_id, UNKNOWN_STATE))
            for agent_id, offered in found.items()]
        return built

    def policy(self, capability: str) -> Policy | None:
        return self.keys.policies.get(capability)

    def quality(self, capability: str, agent_id: str) -> float | None:
        """The instance's quality score for ``capability`` (0..1, mesh/quality.py); None when none is posted."""
        scores = self.keys.quality.get(capability)
        score = scores.get(agent_id) if scores is not None else None
        return score.score if score is not None else None

    def capability_names(self) -> list[str]:
        return sorted(self.keys.offers)
