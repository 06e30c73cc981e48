"""Soft state between registry nodes: who was heard from, and which routers follow which node.

Heartbeats never touch etcd (its write rate must follow state changes, not the heartbeat rate). Each
node instead tells every other node, every ``interval``, which instances it heard from since it last
told them, with when and their load; a node it has not yet told (new, restarted, or after a failed
send) gets everything it knows. Times travel as wall-clock moments, so a message that arrives late or
twice never makes an instance look more recently heard than it was; merging keeps the newest.

Messages are signed with a key derived from the data dir's ``secrets.key`` (``Access.node_key``), which
every node of a cluster already shares (it opens the sealed signing keys), so no key is added.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
import msgspec
from agent_reach.exhaustion import Throttle
from agent_reach.registration import HeartbeatRequest

from registry.service import Registry
from registry.watch import WatchHub
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.gossip")

SIGNATURE_HEADER = "X-AgentReach-Node-Signature"
# A message's entries stop growing past this many bytes: a full hand-over of many instances goes as several
# bodies, each well under the API's limit (1 MiB by default) even with the largest metrics a heartbeat may carry.
CHUNK_BYTES = 256 * 1024
# A message older (or newer) than this is refused: a replay long after the fact, or a node whose clock is off.
MAX_SKEW = 60.0
_TIMEOUT = aiohttp.ClientTimeout(total=2, sock_connect=1)


class Heard(msgspec.Struct, array_like=True, frozen=True):
    """One instance as last heard from: the heartbeat's content and its wall-clock moment."""

    beat: HeartbeatRequest
    at: float


class Tidings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: str
    sent_at: float
    heard: list[Heard] = []
    # The routers following this node's watch feed now (their ids): limits are shared among all of them.
    routers: list[str] = []


_decoder = msgspec.msgpack.Decoder(Tidings)


def sign(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def verified(key: bytes, body: bytes, signature: str | None, now: float) -> Tidings:
    """The message, if a node of this cluster sent it lately; else a 401/400 naming why."""
    if signature is None or not hmac.compare_digest(sign(key, body), signature):
        raise ApiError(401, "unauthenticated", "Not signed by a node of this cluster (do the nodes share "
                       "secrets.key?)", SIGNATURE_HEADER)
    try:
        tidings = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, "invalid_body", f"Not a node-to-node message: {exc}") from None
    if abs(now - tidings.sent_at) > MAX_SKEW:
        raise ApiError(400, "invalid_field", f"Message sent {now - tidings.sent_at:.0f}s from now; nodes' clocks "
                       f"must agree within {MAX_SKEW:.0f}s", "sent_at")
    return tidings


class Gossip:
    """This node's side of the channel: what to send each peer, and applying what peers send."""

    def __init__(self, registry: Registry, hub: WatchHub, node_id: str, key: bytes, session: aiohttp.ClientSession,
                 *, wall_clock: Callable[[], float] = time.time):
        self._registry = registry
        self._hub = hub
        self._node_id = node_id
        self._key = key
        self._session = session
        self._wall_clock = wall_clock
        # Peers that have everything this node knows, so deltas are enough.
        self._told: set[str] = set()
        # node_id -> this node's monotonic clock when it last heard from that node.
        self.last_heard: dict[str, float] = {}
        self._failures = Throttle()

    def _entry(self, agent_id: str, now: float, wall: float) -> Heard | None:
        liveness = self._registry.state.liveness.get(agent_id)
        if liveness is None or liveness.last_seen is None:
            return None
        beat = HeartbeatRequest(agent_id=agent_id, load=liveness.load, inflight=liveness.inflight,
                                health=liveness.health, metrics=liveness.metrics)
        return Heard(beat=beat, at=wall - (now - liveness.last_seen))

    def _entries(self, agent_ids: Iterable[str]) -> list[Heard]:
        now, wall = self._registry.clock(), self._wall_clock()
        return [entry for agent_id in agent_ids if (entry := self._entry(agent_id, now, wall)) is not None]

    def _bodies(self, heard: list[Heard]) -> list[bytes]:
        routers = sorted(self._hub.local_routers())
        chunks: list[list[Heard]] = [[]]
        size = 0
        for entry in heard:
            if size >= CHUNK_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += len(msgspec.msgpack.encode(entry))
        return [msgspec.msgpack.encode(Tidings(node_id=self._node_id, sent_at=self._wall_clock(), heard=chunk,
                                               routers=routers)) for chunk in chunks]

    async def round(self, peers: dict[str, str]) -> None:
        """Tell every peer (node_id -> URL) what it has not heard yet; a peer that misses a message is
        told everything next time."""
        self._told &= set(peers)
        delta, self._registry.heard = self._registry.heard, set()
        delta_bodies = self._bodies(self._entries(delta))
        everything: list[bytes] | None = None
        sends = []
        for node_id, url in peers.items():
            if node_id in self._told:
                sends.append(self._send(node_id, url, delta_bodies))
            else:
                everything = everything or self._bodies(self._entries(self._registry.state.liveness))
                sends.append(self._send(node_id, url, everything))
        await asyncio.gather(*sends)

    async def _send(self, node_id: str, url: str, bodies: list[bytes]) -> None:
        try:
            for body in bodies:
                headers = {SIGNATURE_HEADER: sign(self._key, body), "Content-Type": "application/msgpack"}
                async with self._session.post(f"{url}/cluster/gossip", data=body, headers=headers,
                                              timeout=_TIMEOUT) as response:
                    if response.status != 204:
                        raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                          message=(await response.text())[:200])
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._told.discard(node_id)
            self._failures.log(log, logging.WARNING, "a registry node did not take this node's soft state; it "
                               "gets all of it once it answers", 1, peer=node_id, url=url, error=repr(exc))
            return
        self._told.add(node_id)

    def receive(self, body: bytes, signature: str | None) -> None:
        tidings = verified(self._key, body, signature, self._wall_clock())
        if tidings.node_id == self._node_id:
            return
        now, wall = self._registry.clock(), self._wall_clock()
        for entry in tidings.heard:
            self._registry.heard_elsewhere(entry.beat, now - max(0.0, wall - entry.at))
        self.last_heard[tidings.node_id] = now
        self._hub.set_peer_routers(tidings.node_id, frozenset(tidings.routers))

    def forget(self, node_id: str) -> None:
        """A node left the cluster (its lease ended): its routers no longer count."""
        self._told.discard(node_id)
        self.last_heard.pop(node_id, None)
        self._hub.forget_peer(node_id)
