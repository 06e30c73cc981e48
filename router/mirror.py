"""The router's copy of registry state, built from watch events; the call path reads only this.

The router never asks the registry per call: it follows the registry's watch feed (in process or
over HTTP) and keeps routing on its last view when the feed is interrupted.
"""

from __future__ import annotations

import msgspec
from agent_reach.registration import Capability

from auth.book import AuthBook
from mesh.alerts import AlertConfig
from mesh.keyspace import KeySpace
from mesh.policy import Policy
from mesh.records import InstanceRecord, instance_id
from mesh.watch import Delete, InstanceState, Ping, Put, Reset, States, WatchEvent

UNKNOWN_STATE = InstanceState("pending", 0.0, None)


class Offer(msgspec.Struct, frozen=True):
    """One instance offering one capability, as the router sees it right now."""

    record: InstanceRecord
    capability: Capability
    state: InstanceState


class RegistryMirror:
    def __init__(self) -> None:
        self.revision = 0
        self.synced = False
        self.keys = KeySpace()
        self.states: dict[str, InstanceState] = {}
        # offers() answers per capability, built on first use after any change; never mutate them.
        self._offer_lists: dict[str, list[Offer]] = {}

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
        if not isinstance(event, Ping):
            self._offer_lists.clear()
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

    def _reset(self, event: Reset) -> None:
        self.keys = KeySpace()
        for key, value in event.records.items():
            self.keys.put(key, value)
        self.states = dict(event.states)
        self.revision = event.revision
        self.synced = True

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
            Offer(self.keys.live[agent_id], offered, self.states.get(agent_id, UNKNOWN_STATE))
            for agent_id, offered in found.items()]
        return built

    def policy(self, capability: str) -> Policy | None:
        return self.keys.policies.get(capability)

    def capability_names(self) -> list[str]:
        return sorted(self.keys.offers)
