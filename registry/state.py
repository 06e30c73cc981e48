"""The registry's in-memory view: instance records indexed by capability, plus soft liveness.

It changes only by applying committed store changes (``apply``), so memory always equals
what the log holds. Capability ownership is derived from the live records, an agent_id's service
from its record or binding; ``claim`` reserves both for registrations still on their way to disk
so two services cannot both win a race.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from auth.book import AuthBook
from router.policy import Policy
from router.reach import AlertConfig

from registry.bindings import BINDING_PREFIX, decode_binding
from registry.lifecycle import Liveness
from registry.records import ALERTS_KEY, INSTANCE_PREFIX, POLICY_PREFIX, InstanceRecord, decode_value
from registry.store import Change


class RegistryState:
    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self.records: dict[str, InstanceRecord] = {}
        self.liveness: dict[str, Liveness] = {}
        self.policies: dict[str, Policy] = {}
        self.alerts = AlertConfig()
        self.auth = AuthBook()
        # agent_id -> service of the instances that deregistered, oldest first (registry/bindings.py).
        self.bindings: dict[str, str] = {}
        self._holders: dict[str, dict[str, None]] = {}
        # ("capability" | "agent_id", name) -> (claiming service, registrations in flight).
        self._claims: dict[tuple[str, str], tuple[str, int]] = {}

    def load(self, items: dict[str, bytes]) -> None:
        for key, value in items.items():
            self.apply(Change(key, value))

    def apply(self, change: Change) -> None:
        if change.key == ALERTS_KEY:
            self.alerts = decode_value(change.key, change.value) if change.value is not None else AlertConfig()
        elif change.key.startswith(POLICY_PREFIX):
            self._apply_policy(change)
        elif change.key.startswith(INSTANCE_PREFIX):
            self._apply_instance(change)
        elif change.key.startswith(BINDING_PREFIX):
            self._apply_binding(change)
        elif self.auth.holds(change.key):
            if change.value is None:
                self.auth.delete(change.key)
            else:
                self.auth.put(change.key, decode_value(change.key, change.value))

    def _apply_policy(self, change: Change) -> None:
        capability = change.key[len(POLICY_PREFIX):]
        if change.value is None:
            self.policies.pop(capability, None)
        else:
            self.policies[capability] = decode_value(change.key, change.value)

    def _apply_instance(self, change: Change) -> None:
        agent_id = change.key[len(INSTANCE_PREFIX):]
        self._unindex(agent_id)
        if change.value is None:
            self.records.pop(agent_id, None)
            self.liveness.pop(agent_id, None)
            return
        record = decode_value(change.key, change.value)
        self.records[agent_id] = record
        if record.evicted_at is None:
            self.liveness[agent_id] = Liveness(registered=self._clock())
            for capability in record.capabilities:
                self._holders.setdefault(capability.name, {})[agent_id] = None
        else:
            self.liveness.pop(agent_id, None)

    def _apply_binding(self, change: Change) -> None:
        agent_id = change.key[len(BINDING_PREFIX):]
        self.bindings.pop(agent_id, None)
        if change.value is not None:
            self.bindings[agent_id] = decode_binding(change.value).service

    def _unindex(self, agent_id: str) -> None:
        previous = self.records.get(agent_id)
        if previous is None:
            return
        for capability in previous.capabilities:
            holders = self._holders.get(capability.name)
            if holders is not None:
                holders.pop(agent_id, None)
                if not holders:
                    del self._holders[capability.name]

    def owner(self, name: str, excluding: str | None = None) -> str | None:
        """The service that owns a capability name: from live holders, then from pending claims."""
        for agent_id in self._holders.get(name, ()):
            if agent_id != excluding:
                return self.records[agent_id].service
        claim = self._claims.get(("capability", name))
        return claim[0] if claim else None

    def agent_id_owner(self, agent_id: str) -> str | None:
        """The service an agent_id belongs to: its record's (live or evicted), else the service it
        deregistered from, else the one registering it right now."""
        record = self.records.get(agent_id)
        if record is not None:
            return record.service
        bound = self.bindings.get(agent_id)
        if bound is not None:
            return bound
        claim = self._claims.get(("agent_id", agent_id))
        return claim[0] if claim else None

    def conflicts(self, record: InstanceRecord) -> list[tuple[str, str]]:
        """(capability, owning service) for every name this record may not take."""
        found = []
        for capability in record.capabilities:
            owner = self.owner(capability.name, excluding=record.agent_id)
            if owner is not None and owner != record.service:
                found.append((capability.name, owner))
        return found

    def claim(self, record: InstanceRecord) -> None:
        for name in _claimed(record):
            _, count = self._claims.get(name, (record.service, 0))
            self._claims[name] = (record.service, count + 1)

    def release(self, record: InstanceRecord) -> None:
        for name in _claimed(record):
            service, count = self._claims[name]
            if count == 1:
                del self._claims[name]
            else:
                self._claims[name] = (service, count - 1)

    def holders(self, name: str) -> Iterator[str]:
        return iter(self._holders.get(name, ()))

    def has_capability(self, name: str) -> bool:
        return name in self._holders


def _claimed(record: InstanceRecord) -> list[tuple[str, str]]:
    """What a registration reserves until it is committed: its capability names and its agent_id."""
    return [("capability", capability.name) for capability in record.capabilities] + [("agent_id", record.agent_id)]
