"""The registry's operations, free of HTTP: register, heartbeat, deregister, query, evict.

Every durable change goes through the store (the WAL) and reaches memory only when the store
commits it; heartbeats touch soft state alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec
from agent_reach.registration import HeartbeatRequest, RegisterRequest

from auth.records import TokenRecord, TokenView
from mesh.alerts import AlertConfig
from mesh.egress import Egress
from mesh.intent_rules import IntentRule, intent_rule_key
from mesh.policy import Policy, PolicyError, validate_policy
from mesh.policy_writes import check_write
from mesh.records import (
    ALERTS_KEY,
    INSTANCE_PREFIX,
    AgentIdBinding,
    InstanceRecord,
    binding_key,
    encode_value,
    instance_id,
    instance_key,
    policy_key,
)
from registry.access import Access
from registry.bindings import bindings_to_forget
from registry.budgets import Budgets
from registry.egress import check_destinations
from registry.examples import Examples
from registry.lifecycle import QUERY_ORDER, LifecycleConfig, Liveness, Status, record_heartbeat, status_of
from registry.quality import Quality
from registry.records import build_record
from registry.retention import evicted_to_forget
from registry.state import RegistryState
from registry.store import Change, Fence, Store
from registry.views import AgentView, QueryResult, agent_view, query_instance
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry")


class Counters(msgspec.Struct):
    registrations: int = 0
    deregistrations: int = 0
    heartbeats: int = 0
    evictions: int = 0


class Registry:
    def __init__(self, store: Store, config: LifecycleConfig, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, egress: Egress | None = None):
        self.store = store
        self.config = config
        # Where agents' URLs may point (the operator's --agent-networks): checked before a registration is stored.
        self.egress = egress if egress is not None else Egress()
        self.clock = clock
        self._wall_clock = wall_clock
        self.state = RegistryState(clock)
        self.counters = Counters()
        # Instances whose soft state changed since the watch hub last looked: it publishes only those.
        self.touched: set[str] = set()
        # Called with the agent_id when a heartbeat makes an instance healthy that was not: routers must
        # learn that at once, not at the watch hub's next tick.
        self.revived: list[Callable[[str], None]] = []
        # Instances heard from at this node (heartbeats, passing checks) since the node-to-node channel last
        # looked: it tells the other registry nodes (registry/gossip.py). Unused with one node.
        self.heard: set[str] = set()
        self.state.load(store.snapshot())
        # Who may use the mesh (clients, registration tokens, the admin key), kept in the same store.
        self.access = Access(store, self.state, wall_clock)
        # Learned phrasings of capabilities, confirmed by callers or written by operators (registry/examples.py).
        self.examples = Examples(store, self.state, wall_clock)
        # Client budgets' accounts for their period and the leases routers spend from (registry/budgets.py).
        self.budgets = Budgets(store, self.state, wall_clock)
        # Operators' quality verdicts per instance and capability (registry/quality.py).
        self.quality = Quality(store, self.state, wall_clock)
        # Tokens whose revocation is on its way to the log: registrations with them are refused meanwhile.
        self._revoking: set[str] = set()
        # Policy writes one at a time in this process: a conditional write is checked against every write
        # made before it, not only against those already committed (registry/store.py's WAL orders appends).
        self._policy_writes = asyncio.Lock()
        self._unwatch = store.watch(self._apply)

    def _apply(self, change: Change) -> None:
        self.state.apply(change)
        self.quality.noticed(change.key)
        agent_id = instance_id(change.key)
        if agent_id is not None:
            self.touched.add(agent_id)

    def close(self) -> None:
        self._unwatch()
        self.budgets.close()

    def status(self, agent_id: str, now: float) -> Status:
        record = self.state.records[agent_id]
        liveness = self.state.liveness.get(agent_id)
        if liveness is None:
            return Status.EVICTED
        return status_of(liveness, record.evicted_at is not None, now, self.config)

    async def register(self, request: RegisterRequest, token: TokenRecord | None = None) -> AgentView:
        """Store an instance. With a registration ``token`` (auth on) the instance joins the token's
        service only. An agent_id, like a capability name, belongs to one service (decision 3)."""
        if token is not None:
            if request.service not in (None, token.service):
                raise ApiError(403, "forbidden", f"This registration token is for service {token.service!r}, "
                               f"not {request.service!r}", "service")
            request = msgspec.structs.replace(request, service=token.service)
        record = build_record(request, self._wall_clock(), token.token_id if token is not None else None)
        await check_destinations(record, self.egress)
        # Memory is checked at one revision and the write is refused if ownership may have changed since
        # (another registry on the same etcd): check again at the newer revision and retry.
        while True:
            since = self.store.revision
            self._check_free(record)
            if token is not None and self._revoked(token.token_id):
                raise ApiError(401, "unauthenticated", "Unknown or revoked registration token", "Authorization")
            self.state.claim(record)
            try:
                written = await self._write_owned(record, since)
            finally:
                self.state.release(record)
            if written is not None:
                break
        self.counters.registrations += 1
        log.info("instance registered", extra={"agent_id": record.agent_id, "service": record.service,
                                              "capabilities": [c.name for c in record.capabilities]})
        return self.agent(record.agent_id)

    async def _write_owned(self, record: InstanceRecord, since: int) -> int | None:
        """Write a registration only if ownership is still what memory said at ``since``. Whoever else writes
        this agent_id touches its two keys. A name the service holds already (a live instance offers it)
        only needs nobody to have taken it since: its claim key is compared. A name it takes anew is
        touched, and every instance key is compared too, since another instance of the old owner may have
        been written without touching it; that scan is paid once per name a service first takes."""
        held = {capability.name for capability in record.capabilities
                if self.state.holds(capability.name, record.service, excluding=record.agent_id)}
        taken = [capability.name for capability in record.capabilities if capability.name not in held]
        guarded = [instance_key(record.agent_id), binding_key(record.agent_id)] + ([INSTANCE_PREFIX] if taken else [])
        return await self.store.put_if_unchanged(instance_key(record.agent_id), encode_value(record), since, guarded,
                                                 [f"capability/{name}" for name in taken],
                                                 [f"capability/{name}" for name in sorted(held)])

    def _check_free(self, record: InstanceRecord) -> None:
        """409 when memory says another service owns the record's agent_id or one of its capabilities."""
        owner = self.state.agent_id_owner(record.agent_id)
        if owner is not None and owner != record.service:
            raise ApiError(409, "agent_id_taken", f"Agent id {record.agent_id!r} belongs to service {owner!r}; "
                           f"service {record.service!r} cannot take it", "agent_id", owner=owner)
        conflicts = self.state.conflicts(record)
        if conflicts:
            name, owner = conflicts[0]
            raise ApiError(
                409, "capability_owned",
                f"Capability {name!r} is owned by service {owner!r}; service {record.service!r} cannot claim it",
                f"capabilities[{[c.name for c in record.capabilities].index(name)}].name",
                capability=name, owner=owner,
            )

    def _revoked(self, token_id: str) -> bool:
        """Checked with no await before the append: the token may have been revoked since the gate let
        the request in (its body was still being read)."""
        current = self.state.auth.tokens.get(token_id)
        return token_id in self._revoking or current is None or current.revoked

    async def revoke_token(self, token_id: str) -> TokenView:
        """Revoke a registration token and evict its instances at once, so nothing keeps serving under it.

        Evictions come first: a crash before the revocation is logged leaves evicted instances and a
        valid token (revoking again finishes the job), never a revoked token with instances serving.
        The second pass evicts registrations that were already on their way to the log."""
        self._revoking.add(token_id)
        try:
            await self._evict_joined_with(token_id)
            view = await self.access.revoke_token(token_id)
            await self._evict_joined_with(token_id)
        finally:
            self._revoking.discard(token_id)
        return view

    async def _evict_joined_with(self, token_id: str) -> None:
        joined = [agent_id for agent_id, record in self.state.records.items()
                  if record.token_id == token_id and record.evicted_at is None]
        await asyncio.gather(*(self.evict(agent_id, "registration token revoked") for agent_id in joined))

    def _check_owned(self, agent_id: str, token: TokenRecord | None) -> None:
        """A token's holder may act on its own service's instances only."""
        record = self.state.records.get(agent_id)
        if token is not None and record is not None and record.service != token.service:
            raise ApiError(403, "forbidden", f"Instance {agent_id!r} belongs to service {record.service!r}; "
                           f"this registration token is for {token.service!r}", "agent_id")

    def heartbeat(self, request: HeartbeatRequest, token: TokenRecord | None = None) -> Status:
        self._check_owned(request.agent_id, token)
        liveness = self.state.liveness.get(request.agent_id)
        if liveness is None:
            raise ApiError(404, "unknown_agent", f"No live instance {request.agent_id!r}; register again",
                           "agent_id")
        self._heard(request, liveness, self.clock())
        self.heard.add(request.agent_id)
        self.counters.heartbeats += 1
        return Status.HEALTHY

    def heard_elsewhere(self, beat: HeartbeatRequest, at: float) -> None:
        """A heartbeat another registry node took at ``at`` (this node's clock): kept when newer than the
        last this node knows of, so relayed or replayed news never turns an instance's clock back."""
        liveness = self.state.liveness.get(beat.agent_id)
        if liveness is not None and (liveness.last_seen is None or at > liveness.last_seen):
            self._heard(beat, liveness, min(at, self.clock()))

    def _heard(self, beat: HeartbeatRequest, liveness: Liveness, at: float) -> None:
        now = self.clock()
        was_healthy = status_of(liveness, False, now, self.config) is Status.HEALTHY
        record_heartbeat(liveness, at)
        self.touched.add(beat.agent_id)
        liveness.load = beat.load
        if beat.inflight is not None:
            liveness.inflight = beat.inflight
        if beat.health is not None:
            liveness.health = beat.health
        if beat.metrics is not None:
            liveness.metrics = beat.metrics
        if not was_healthy and status_of(liveness, False, now, self.config) is Status.HEALTHY:
            for listener in self.revived:
                listener(beat.agent_id)

    async def deregister(self, agent_id: str, token: TokenRecord | None = None) -> None:
        """Delete the instance; its agent_id stays its service's (a binding, written first so that
        some record names the owner at every moment)."""
        self._check_owned(agent_id, token)
        record = self.state.records.get(agent_id)
        if record is None:
            raise ApiError(404, "unknown_agent", f"No instance {agent_id!r}", "agent_id")
        await self._release(record)
        self.counters.deregistrations += 1
        log.info("instance deregistered", extra={"agent_id": agent_id, "service": record.service})

    async def _release(self, record: InstanceRecord) -> None:
        """Delete an instance record; its agent_id stays its service's (a binding, written first)."""
        binding = AgentIdBinding(service=record.service, released_at=self._wall_clock())
        await self.store.put(binding_key(record.agent_id), encode_value(binding))
        await self.store.delete(instance_key(record.agent_id))
        # One at a time, looking again after each: another deregistration may be forgetting too.
        while forgotten := bindings_to_forget(self.state.bindings, self.config.kept_agent_ids):
            await self.store.delete(binding_key(forgotten[0]))
            await self.quality.forget(forgotten[0])

    async def evict(self, agent_id: str, reason: str, fence: Fence | None = None) -> None:
        """``fence``: written only while it holds (the leader's, so a node that lost the lead evicts nothing)."""
        record = self.state.records.get(agent_id)
        if record is None or record.evicted_at is not None:
            return
        evicted = msgspec.structs.replace(record, evicted_at=self._wall_clock())
        await self.store.put(instance_key(agent_id), encode_value(evicted), fence)
        self.counters.evictions += 1
        log.warning("instance evicted", extra={"agent_id": agent_id, "service": record.service, "reason": reason,
                                               "term": fence.create_revision if fence is not None else None})
        for forgotten in evicted_to_forget(self.state.records.values(), self._wall_clock(),
                                           self.config.kept_evicted, self.config.evicted_max_age):
            old = self.state.records.get(forgotten)
            if old is not None and old.evicted_at is not None:  # not registered again meanwhile
                await self._release(old)

    def query(self, name: str) -> QueryResult:
        now = self.clock()
        found = []
        for agent_id in self.state.holders(name):
            record = self.state.records[agent_id]
            state = self.status(agent_id, now)
            capability = next(c for c in record.capabilities if c.name == name)
            found.append(query_instance(record, capability, self.state.liveness[agent_id], state, now))
        if not found:
            raise ApiError(404, "capability_not_found", f"No instance offers capability {name!r}",
                           "capability")
        found.sort(key=lambda instance: (QUERY_ORDER[instance.state], instance.load))
        return QueryResult(capability=name, service=self.state.owner(name) or "", instances=found)

    async def put_policy(self, capability: str, policy: Policy, based_on: str | None = None,
                         absent: bool = False) -> Policy:
        """``based_on``: the digest of the policy this one was made from, or ANY_POLICY; ``absent``: written only
        where none is stored (mesh/policy_writes.py); raises :class:`PolicyChanged`, writing nothing, when the
        stored policy is another by now."""
        try:
            validate_policy(policy, capability)
        except PolicyError as exc:
            raise ApiError(400, "invalid_policy", exc.message, exc.field) from None
        stored = msgspec.structs.replace(policy, capability=capability)
        key = policy_key(capability)
        async with self._policy_writes:
            if based_on is not None or absent:  # the writer may know a write memory has not applied yet
                await self.store.caught_up(key)
            # Another registry node on the same etcd may write it after memory was checked: check again then.
            while True:
                since = self.store.revision
                current = self.state.policies.get(capability)
                check_write(capability, current, based_on, absent)
                if await self.store.put_if_unchanged(key, encode_value(stored), since, [key]) is not None:
                    break
        log.info("policy saved", extra={"capability": capability, "policy": stored.policy})
        return stored

    async def delete_policy(self, capability: str) -> None:
        self.policy(capability)
        async with self._policy_writes:
            await self.store.delete(policy_key(capability))
        log.info("policy deleted", extra={"capability": capability})

    def policy(self, capability: str) -> Policy:
        policy = self.state.policies.get(capability)
        if policy is None:
            raise ApiError(404, "policy_not_found", f"No policy stored for {capability!r}", "capability")
        return policy

    async def put_intent_rule(self, model: str, rule: IntentRule) -> IntentRule:
        await self.store.put(intent_rule_key(model), encode_value(rule))
        log.info("intent rule saved", extra={"model": model, "threshold": rule.threshold, "margin": rule.margin})
        return rule

    async def delete_intent_rule(self, model: str) -> None:
        self.intent_rule(model)
        await self.store.delete(intent_rule_key(model))
        log.info("intent rule deleted", extra={"model": model})

    def intent_rule(self, model: str) -> IntentRule:
        rule = self.state.keys.intent_rules.get(model)
        if rule is None:
            raise ApiError(404, "intent_rule_not_found", f"No intent rule stored for model {model!r}", "model")
        return rule

    async def put_alert_settings(self, config: AlertConfig) -> AlertConfig:
        await self.store.put(ALERTS_KEY, encode_value(config))
        log.info("alert settings saved", extra={"reach_threshold": config.reach_threshold,
                                                "consecutive_periods": config.consecutive_periods,
                                                "min_failures": config.min_failures})
        return config

    def agent(self, agent_id: str) -> AgentView:
        record = self.state.records.get(agent_id)
        if record is None:
            raise ApiError(404, "unknown_agent", f"No instance {agent_id!r}", "agent_id")
        now = self.clock()
        return agent_view(record, self.state.liveness.get(agent_id), self.status(agent_id, now), now)

    def agents(self) -> list[AgentView]:
        return [self.agent(agent_id) for agent_id in self.state.records]

    def records_by_status(self, now: float) -> dict[Status, list[InstanceRecord]]:
        grouped: dict[Status, list[InstanceRecord]] = {status: [] for status in Status}
        for agent_id, record in self.state.records.items():
            grouped[self.status(agent_id, now)].append(record)
        return grouped
