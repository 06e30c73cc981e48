"""The router's copy of registry state, built from watch events; the call path reads only this.

The router never asks the registry per call: it follows the registry's watch feed (in process or
over HTTP) and keeps routing on its last view when the feed is interrupted.
"""

from __future__ import annotations

import msgspec
from agent_reach.registration import Capability
from auth.book import AuthBook

from registry.records import ALERTS_KEY, INSTANCE_PREFIX, POLICY_PREFIX, InstanceRecord
from registry.watch import Delete, InstanceState, Ping, Put, Reset, States, WatchEvent
from router.policy import Policy
from router.reach import AlertConfig

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
        self.instances: dict[str, InstanceRecord] = {}
        self.states: dict[str, InstanceState] = {}
        self.policies: dict[str, Policy] = {}
        self.alerts: AlertConfig | None = None
        self.auth = AuthBook()
        self._offers: dict[str, dict[str, Capability]] = {}
        # offers() answers per capability, built on first use after any change; never mutate them.
        self._offer_lists: dict[str, list[Offer]] = {}

    def apply(self, event: WatchEvent) -> None:
        if not isinstance(event, Ping):
            self._offer_lists.clear()
        if isinstance(event, Reset):
            self._reset(event)
        elif isinstance(event, Put):
            self._put(event.key, event.value)
            self.revision = event.revision
        elif isinstance(event, Delete):
            self._delete(event.key)
            self.revision = event.revision
        elif isinstance(event, States):
            self.states.update(event.states)
        elif isinstance(event, Ping):
            pass

    def _reset(self, event: Reset) -> None:
        self.instances.clear()
        self.policies.clear()
        self.alerts = None
        self.auth = AuthBook()
        self._offers.clear()
        for key, value in event.records.items():
            self._put(key, value)
        self.states = dict(event.states)
        self.revision = event.revision
        self.synced = True

    def _put(self, key: str, value: object) -> None:
        if self.auth.holds(key):
            self.auth.put(key, value)
        elif key == ALERTS_KEY and isinstance(value, AlertConfig):
            self.alerts = value
        elif key.startswith(POLICY_PREFIX) and isinstance(value, Policy):
            self.policies[key[len(POLICY_PREFIX):]] = value
        elif key.startswith(INSTANCE_PREFIX) and isinstance(value, InstanceRecord):
            self._delete(key)
            if value.evicted_at is None:
                self.instances[value.agent_id] = value
                for capability in value.capabilities:
                    self._offers.setdefault(capability.name, {})[value.agent_id] = capability

    def _delete(self, key: str) -> None:
        if self.auth.holds(key):
            self.auth.delete(key)
            return
        if key == ALERTS_KEY:
            self.alerts = None
            return
        if key.startswith(POLICY_PREFIX):
            self.policies.pop(key[len(POLICY_PREFIX):], None)
            return
        if not key.startswith(INSTANCE_PREFIX):
            return
        agent_id = key[len(INSTANCE_PREFIX):]
        previous = self.instances.pop(agent_id, None)
        self.states.pop(agent_id, None)
        if previous is None:
            return
        for capability in previous.capabilities:
            offers = self._offers.get(capability.name)
            if offers is not None:
                offers.pop(agent_id, None)
                if not offers:
                    del self._offers[capability.name]

    def offers(self, capability: str) -> list[Offer] | None:
        """Every instance offering ``capability``; None when no instance does (unknown capability)."""
        cached = self._offer_lists.get(capability)
        if cached is not None:
            return cached
        found = self._offers.get(capability)
        if not found:
            return None
        built = self._offer_lists[capability] = [
            Offer(self.instances[agent_id], offered, self.states.get(agent_id, UNKNOWN_STATE))
            for agent_id, offered in found.items()]
        return built

    def policy(self, capability: str) -> Policy | None:
        return self.policies.get(capability)

    def capability_names(self) -> list[str]:
        return sorted(self._offers)
