"""The registry's side of the change feed (events in mesh/watch.py): one hub serves every follower.

The router in the same process reads events straight from a subscription, a router elsewhere
reads the same events as JSON lines from `GET /watch`. Durable changes carry the store revision;
soft state (status, load) travels as `states` events sent only for instances whose values changed
since the last tick.

The hub also knows which routers follow the mesh: a follower that names itself (`router_id`) is a
live router while its stream is open here, and the routers following other registry nodes are told
to it (``set_peer_routers``). Every change of that set is published as a ``Routers`` event, to the
routers only: a follower that names no router (an older router among them) gets the feed as before.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator

from mesh.records import decode_value, instance_id
from mesh.watch import Delete, InstanceState, Ping, Put, Reset, Routers, States, WatchEvent
from registry.service import Registry
from registry.store import Change

log = logging.getLogger("agentreach.registry.watch")


class Subscription:
    """One follower's queue; overflowing it ends the stream (the follower resumes by revision).
    ``router_id`` names a router, live while this stream is open."""

    def __init__(self, hub: WatchHub, limit: int, router_id: str | None = None):
        self._hub = hub
        self.router_id = router_id
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(limit)

    def offer(self, event: WatchEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            log.warning("watch follower too slow; closing its stream so it resumes from its revision")
            self.end()

    def end(self) -> None:
        """End the stream now, dropping what is still queued: the follower resumes from the revision it
        applied, so it is sent again what it missed. Sending newer changes past a dropped one would
        move its revision past a change it never saw."""
        self._hub.unsubscribe(self)
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        try:
            while (event := await self._queue.get()) is not None:
                yield event
        finally:
            self._hub.unsubscribe(self)


class WatchHub:
    def __init__(self, registry: Registry, *, history: int = 10_000, tick: float = 0.5,
                 queue_limit: int = 100_000, node_id: str = "local"):
        self._registry = registry
        self.node_id = node_id
        # Open streams per router id here (a router reconnecting may briefly hold two), and the routers
        # that follow other registry nodes, by node.
        self._local_routers: Counter[str] = Counter()
        self._peer_routers: dict[str, frozenset[str]] = {}
        self._announced: list[str] = []
        self._history: deque[Change] = deque(maxlen=history)
        self._subscribers: list[Subscription] = []
        self._tick = tick
        self._queue_limit = queue_limit
        self._states: dict[str, InstanceState] = {}
        # (moment an instance's silence timeout runs out, agent_id): when to look at it again.
        self._deadlines: list[tuple[float, str]] = []
        self._unwatch = registry.store.watch(self._on_change)
        registry.revived.append(self._publish_revived)

    def close(self) -> None:
        self._unwatch()
        self._registry.revived.remove(self._publish_revived)
        self.end_streams()

    def end_streams(self) -> None:
        """End every follower's stream: they resume from their revision, here or at another node."""
        for subscription in list(self._subscribers):
            subscription.end()

    def _state_of(self, agent_id: str, now: float) -> InstanceState | None:
        liveness = self._registry.state.liveness.get(agent_id)
        if liveness is None:
            return None
        return InstanceState(self._registry.status(agent_id, now).value, liveness.load, liveness.inflight)

    def current_states(self) -> dict[str, InstanceState]:
        now = self._registry.clock()
        return {agent_id: state for agent_id in self._registry.state.liveness
                if (state := self._state_of(agent_id, now)) is not None}

    def changed_states(self) -> dict[str, InstanceState]:
        """Soft state that changed since the last call: instances touched by heartbeats, checks or
        registrations, and those whose silence timeout has just run out. Never a scan of all."""
        registry = self._registry
        now = registry.clock()
        touched, registry.touched = registry.touched, set()
        silence = registry.config.silence_timeout
        for agent_id in touched:
            liveness = registry.state.liveness.get(agent_id)
            if liveness is not None:
                seen = liveness.last_seen if liveness.last_seen is not None else liveness.registered
                heapq.heappush(self._deadlines, (seen + silence + 0.001, agent_id))
        while self._deadlines and self._deadlines[0][0] <= now:
            touched.add(heapq.heappop(self._deadlines)[1])
        changed = {}
        for agent_id in touched:
            state = self._state_of(agent_id, now)
            if state is None:
                self._states.pop(agent_id, None)
            elif self._states.get(agent_id) != state:
                changed[agent_id] = self._states[agent_id] = state
        return changed

    def subscribe(self, since: int | None = None, router_id: str | None = None) -> Subscription:
        """Start a follower: the changes after ``since`` if the hub still has them, else a full reset;
        for a router, then the live routers (``router_id`` among them while this stream is open)."""
        subscription = Subscription(self, self._queue_limit, router_id)
        revision = self._registry.store.revision
        oldest = self._history[0].revision if self._history else revision + 1
        if since is not None and since <= revision and since >= oldest - 1:
            for change in self._history:
                if change.revision > since:
                    subscription.offer(self._event(change))
            subscription.offer(States(states=self.current_states()))
        else:
            records = {key: self._registry.access.opened(decode_value(key, value))
                       for key, value in self._registry.store.snapshot().items()}
            subscription.offer(Reset(revision=revision, records=records, states=self.current_states()))
        self._subscribers.append(subscription)
        if router_id is not None:
            self._local_routers[router_id] += 1
        if not self._announce() and router_id is not None:
            subscription.offer(Routers(routers=self._announced))
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription not in self._subscribers:
            return
        self._subscribers.remove(subscription)
        router_id = subscription.router_id
        if router_id is not None:
            self._local_routers[router_id] -= 1
            if not self._local_routers[router_id]:
                del self._local_routers[router_id]
            self._announce()

    def local_routers(self) -> frozenset[str]:
        """The routers whose watch stream is open on this hub now."""
        return frozenset(self._local_routers)

    def set_peer_routers(self, node_id: str, routers: frozenset[str]) -> None:
        """The routers following another registry node, as that node last said."""
        self._peer_routers[node_id] = routers
        self._announce()

    def forget_peer(self, node_id: str) -> None:
        """A registry node that left: its routers no longer count (they follow another node, or died)."""
        if self._peer_routers.pop(node_id, None) is not None:
            self._announce()

    def routers(self) -> dict[str, str]:
        """Every live router's id -> the node whose feed it follows (this node wins a tie)."""
        found = {router_id: node_id for node_id, routers in self._peer_routers.items() for router_id in routers}
        found.update(dict.fromkeys(self._local_routers, self.node_id))
        return found

    def _announce(self) -> bool:
        """Publish the live routers if they changed since last published; whether they had."""
        current = sorted(self.routers())
        if current == self._announced:
            return False
        self._announced = current
        log.info("live routers changed", extra={"routers": current, "node": self.node_id})
        event = Routers(routers=current)
        for subscription in list(self._subscribers):
            if subscription.router_id is not None:
                subscription.offer(event)
        return True

    def _event(self, change: Change) -> Put | Delete:
        if change.value is None:
            return Delete(revision=change.revision, key=change.key)
        return Put(revision=change.revision, key=change.key,
                   value=self._registry.access.opened(decode_value(change.key, change.value)))

    def _publish(self, event: WatchEvent) -> None:
        for subscription in list(self._subscribers):
            subscription.offer(event)

    def _publish_revived(self, agent_id: str) -> None:
        """An instance just became healthy (its first heartbeat, or back from demoted): publish it now,
        so a router does not route its first calls as degraded while waiting for the tick."""
        state = self._state_of(agent_id, self._registry.clock())
        if state is not None and self._states.get(agent_id) != state:
            self._states[agent_id] = state
            self._publish(States(states={agent_id: state}))

    def _on_change(self, change: Change) -> None:
        agent_id = instance_id(change.key)
        if agent_id is not None:
            # A follower forgets an instance's soft state when its record changes (a registration starts
            # pending again), so what it was last sent is no guide to what must be sent next.
            self._states.pop(agent_id, None)
        self._history.append(change)
        if self._subscribers:
            self._publish(self._event(change))

    async def run(self) -> None:
        """Every tick, publish the soft state that changed; a quiet feed still pings."""
        quiet_ticks = 0
        while True:
            await asyncio.sleep(self._tick)
            changed = self.changed_states()
            if changed:
                self._publish(States(states=changed))
                quiet_ticks = 0
            else:
                quiet_ticks += 1
                if quiet_ticks * self._tick >= 5:
                    self._publish(Ping(revision=self._registry.store.revision))
                    quiet_ticks = 0
