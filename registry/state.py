"""The registry's in-memory view: the key space (mesh/keyspace.py, read as a router's mirror reads
it), soft liveness, agent_id bindings and the claims of registrations in flight.

It changes only by applying committed store changes (``apply``), so memory always equals
what the log holds. Capability ownership is derived from the live records, an agent_id's service
from its record or binding; ``claim`` reserves both for registrations still on their way to disk
so two services cannot both win a race in this process. Across registries sharing etcd, the store's
``put_if_unchanged`` decides (registry/service.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from auth.book import AuthBook
from mesh.alerts import AlertConfig
from mesh.keyspace import KeySpace
from mesh.policy import Policy
from mesh.records import BINDING_PREFIX, InstanceRecord, decode_binding, decode_value, instance_id
from registry.lifecycle import Liveness
from registry.store import Change


class RegistryState:
    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self.keys = KeySpace()
        self.liveness: dict[str, Liveness] = {}
        # agent_id -> service of the instances that deregistered, oldest first (registry/bindings.py).
        self.bindings: dict[str, str] = {}
        # ("capability" | "agent_id", name) -> (claiming service, registrations in flight).
        self._claims: dict[tuple[str, str], tuple[str, int]] = {}

    @property
    def records(self) -> dict[str, InstanceRecord]:
        """Every instance record, evicted ones too."""
        return self.keys.records

    @property
    def policies(self) -> dict[str, Policy]:
        return self.keys.policies

    @property
    def alerts(self) -> AlertConfig:
        """The stored alert settings, or the defaults while none are stored."""
        return self.keys.alerts if self.keys.alerts is not None else AlertConfig()

    @property
    def auth(self) -> AuthBook:
        return self.keys.auth

    def load(self, items: dict[str, bytes]) -> None:
        for key, value in items.items():
            self.apply(Change(key, value))

    def apply(self, change: Change) -> None:
        if change.key.startswith(BINDING_PREFIX):
            self._apply_binding(change)
            return
        if change.value is None:
            self.keys.delete(change.key)
        else:
            self.keys.put(change.key, decode_value(change.key, change.value))
        agent_id = instance_id(change.key)
        if agent_id is None:
            return
        if agent_id in self.keys.live:
            self.liveness[agent_id] = Liveness(registered=self._clock())
        else:
            self.liveness.pop(agent_id, None)

    def _apply_binding(self, change: Change) -> None:
        agent_id = change.key[len(BINDING_PREFIX):]
        self.bindings.pop(agent_id, None)
        if change.value is not None:
            self.bindings[agent_id] = decode_binding(change.value).service

    def owner(self, name: str, excluding: str | None = None) -> str | None:
        """The service that owns a capability name: from live holders, then from pending claims."""
        for agent_id in self.keys.offers.get(name, ()):
            if agent_id != excluding:
                return self.records[agent_id].service
        claim = self._claims.get(("capability", name))
        return claim[0] if claim else None

    def holds(self, name: str, service: str, excluding: str) -> bool:
        """Whether a live instance of ``service`` other than ``excluding`` offers ``name`` (committed, not claimed)."""
        return any(agent_id != excluding and self.records[agent_id].service == service
                   for agent_id in self.keys.offers.get(name, ()))

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
        return iter(self.keys.offers.get(name, ()))

    def has_capability(self, name: str) -> bool:
        return name in self.keys.offers


def _claimed(record: InstanceRecord) -> list[tuple[str, str]]:
    """What a registration reserves until it is committed: its capability names and its agent_id."""
    return [("capability", capability.name) for capability in record.capabilities] + [("agent_id", record.agent_id)]
