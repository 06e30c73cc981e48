"""The stored key space read as objects, one way for every reader.

The registry's state applies its log's committed changes here, a router's mirror the watch feed's
events, so both build the same capability -> instance index, policies, alert settings and
credentials from the same keys; a new kind of key is taught to both in one place.
"""

from __future__ import annotations

from typing import Any

from agent_reach.registration import Capability

from auth.book import AuthBook
from mesh.alerts import AlertConfig
from mesh.examples import (
    EXAMPLE_PREFIX,
    EXAMPLE_SETTINGS_PREFIX,
    ExampleSettings,
    LearnedExample,
    split_example_key,
)
from mesh.intent_rules import INTENT_RULE_PREFIX, IntentRule
from mesh.policy import Policy
from mesh.quality import QUALITY_PREFIX, QualityScore, split_quality_key
from mesh.records import ALERTS_KEY, POLICY_PREFIX, InstanceRecord, instance_id


class KeySpace:
    def __init__(self) -> None:
        # Every instance record by agent_id, evicted ones too (kept as history until retention forgets them).
        self.records: dict[str, InstanceRecord] = {}
        # The instances that take calls: the records not evicted.
        self.live: dict[str, InstanceRecord] = {}
        # capability name -> agent_id -> what that live instance offers under the name, oldest registration first.
        self.offers: dict[str, dict[str, Capability]] = {}
        self.policies: dict[str, Policy] = {}
        # None until an operator stores alert settings: each reader falls back to its own default.
        self.alerts: AlertConfig | None = None
        self.auth = AuthBook()
        # capability -> example id -> learned example (mesh/examples.py), every state.
        self.examples: dict[str, dict[str, LearnedExample]] = {}
        self.example_settings: dict[str, ExampleSettings] = {}
        # capability -> agent_id -> the instance's quality score (mesh/quality.py).
        self.quality: dict[str, dict[str, QualityScore]] = {}
        # embedding model name -> its calibrated threshold and margin (mesh/intent_rules.py).
        self.intent_rules: dict[str, IntentRule] = {}

    def put(self, key: str, value: object) -> None:
        """Apply a stored value, already decoded; a value that is not what its key holds changes nothing."""
        agent_id = instance_id(key)
        if agent_id is not None:
            if isinstance(value, InstanceRecord):
                self._put_instance(agent_id, value)
        elif key.startswith(POLICY_PREFIX):
            if isinstance(value, Policy):
                self.policies[key[len(POLICY_PREFIX):]] = value
        elif key == ALERTS_KEY:
            if isinstance(value, AlertConfig):
                self.alerts = value
        elif key.startswith(EXAMPLE_PREFIX):
            if isinstance(value, LearnedExample):
                capability, identifier = split_example_key(key)
                self.examples.setdefault(capability, {})[identifier] = value
        elif key.startswith(EXAMPLE_SETTINGS_PREFIX):
            if isinstance(value, ExampleSettings):
                self.example_settings[key[len(EXAMPLE_SETTINGS_PREFIX):]] = value
        elif key.startswith(QUALITY_PREFIX):
            if isinstance(value, QualityScore):
                capability, agent_id = split_quality_key(key)
                self.quality.setdefault(capability, {})[agent_id] = value
        elif key.startswith(INTENT_RULE_PREFIX):
            if isinstance(value, IntentRule):
                self.intent_rules[key[len(INTENT_RULE_PREFIX):]] = value
        elif self.auth.holds(key):
            self.auth.put(key, value)

    def delete(self, key: str) -> None:
        agent_id = instance_id(key)
        if agent_id is not None:
            self._unindex(agent_id)
            self.records.pop(agent_id, None)
        elif key.startswith(POLICY_PREFIX):
            self.policies.pop(key[len(POLICY_PREFIX):], None)
        elif key == ALERTS_KEY:
            self.alerts = None
        elif key.startswith(EXAMPLE_PREFIX):
            _forget(self.examples, *split_example_key(key))
        elif key.startswith(EXAMPLE_SETTINGS_PREFIX):
            self.example_settings.pop(key[len(EXAMPLE_SETTINGS_PREFIX):], None)
        elif key.startswith(QUALITY_PREFIX):
            _forget(self.quality, *split_quality_key(key))
        elif key.startswith(INTENT_RULE_PREFIX):
            self.intent_rules.pop(key[len(INTENT_RULE_PREFIX):], None)
        elif self.auth.holds(key):
            self.auth.delete(key)

    def _put_instance(self, agent_id: str, record: InstanceRecord) -> None:
        self._unindex(agent_id)
        self.records[agent_id] = record
        if record.evicted_at is None:
            self.live[agent_id] = record
            for capability in record.capabilities:
                self.offers.setdefault(capability.name, {})[agent_id] = capability

    def _unindex(self, agent_id: str) -> None:
        previous = self.live.pop(agent_id, None)
        if previous is None:
            return
        for capability in previous.capabilities:
            offers = self.offers.get(capability.name)
            if offers is not None:
                offers.pop(agent_id, None)
                if not offers:
                    del self.offers[capability.name]


def _forget(by_capability: dict[str, dict[str, Any]], capability: str, name: str) -> None:
    """Drop one record of a capability, and the capability's entry with its last record."""
    records = by_capability.get(capability, {})
    records.pop(name, None)
    if not records:
        by_capability.pop(capability, None)
