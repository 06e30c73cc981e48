"""A registry node in etcd mode: one lease per node, the nodes' list, a fenced leader, and how current
this node's view is.

- **One lease per node** (never per instance: lease counts and churn are etcd's known breaking points),
  kept alive every ``ttl / 3``. The node's entry ``<cluster>/nodes/<node_id>`` lives on it, so a node
  that dies leaves the list when its lease runs out.
- **Leader**: ``<cluster>/leader`` is created on the lease of the node that wins a transaction
  ("create it if nobody holds it"). Its create revision is the leader's *term*; every eviction is
  written in a transaction that requires the key to still have that create revision (the fence), so a
  node that lost the lead cannot evict, even late. The leader also stops sweeping on its own as soon as
  its lease could have run out (keep-alives failing), before anyone else can be elected.
- **Current view**: the nodes' list and the leader are read every ``poll`` seconds with a quorum read;
  a node that cannot make one (cut off from etcd, or etcd without quorum) knows its view may be stale
  and says so (`stale_seconds`).

The cluster's keys are beside the records' prefix (``/agentreach/`` -> ``/agentreach.cluster/``), so
the records' watch never sees them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.exhaustion import Throttle

from auth.kek import SECRETS_KEY_FILE, SecretsKeyError
from mesh.cluster import ClusterView, EtcdEndpoint, NodeView
from registry.cluster import router_views
from registry.etcd_http import EtcdHttp, Range, Txn, b64, decode, prefix_end, unb64
from registry.gossip import Gossip
from registry.service import Registry
from registry.store import Fence
from registry.watch import WatchHub
from wal import WalUnavailable
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.cluster")

_HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=1)


class NodeEntry(msgspec.Struct, kw_only=True):
    """What ``<cluster>/nodes/<node_id>`` holds."""

    node_id: str
    url: str
    started_at: float


class _Granted(msgspec.Struct):
    ID: int
    TTL: int = 0


class _KeptAlive(msgspec.Struct):
    ID: int = 0
    TTL: int = 0


class _KeepAliveLine(msgspec.Struct):
    result: _KeptAlive | None = None


class _Health(msgspec.Struct):
    health: str = "false"


def cluster_prefix(records_prefix: str) -> str:
    return records_prefix.rstrip("/") + ".cluster/"


class EtcdMembership:
    def __init__(self, registry: Registry, hub: WatchHub, endpoints: list[str], records_prefix: str, *,
                 node_key: bytes, ttl: int = 5, poll: float = 0.5, gossip_interval: float = 0.5,
                 timeout: float = 3.0):
        # The hub's: the routers following this node's feed are reported under this id.
        self.node_id = hub.node_id
        self.url = ""
        self._registry = registry
        self._hub = hub
        self._etcd = EtcdHttp(endpoints, timeout)
        self._prefix = cluster_prefix(records_prefix)
        self._leader_key = self._prefix + "leader"
        self._ttl = ttl
        self._poll = poll
        self._gossip_interval = gossip_interval
        self._node_key = node_key
        self._started_at = time.time()
        self._lease: int | None = None
        # Monotonic moment until which this node's lease surely holds (a keep-alive's send time + TTL).
        self._lease_until = 0.0
        self._term: int | None = None
        self._leader: str | None = None
        self.nodes: dict[str, NodeEntry] = {}
        self._last_view = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self.gossip: Gossip | None = None
        # How many times this node took the lead, and evictions refused because it had lost it.
        self.terms_won = 0
        self._said_stale = False
        self._step_failures = Throttle()
        self._bad_entries = Throttle()

    # Decisions, read by the health checker, the API and /metrics.

    def leads(self) -> bool:
        return self._term is not None and time.monotonic() < self._lease_until

    def fence(self) -> Fence | None:
        return Fence(key=self._leader_key, create_revision=self._term) if self._term is not None else None

    def stale_seconds(self) -> float | None:
        """A quorum read more than a couple of polls ago (and at least two seconds): the view may be stale."""
        silent = time.monotonic() - self._last_view
        return round(silent, 3) if silent > max(2.0, 4 * self._poll) else None

    @property
    def etcd_rtt(self) -> float | None:
        return self._etcd.last_rtt

    # Life cycle.

    async def start(self, url: str) -> None:
        """Join: a lease, this node's entry, a first look at the cluster; then keep all of it current."""
        self.url = url
        self._etcd.open()
        self.gossip = Gossip(self._registry, self._hub, self.node_id, self._node_key, self._etcd.session)
        try:
            await self._check_secrets_key()
            await self._join()
            await self._look()
        except BaseException:
            await self._etcd.close()
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._every(self._ttl / 3, self._keep_alive)),
                       loop.create_task(self._every(self._poll, self._look)),
                       loop.create_task(self._every(self._poll, self._mind_staleness)),
                       loop.create_task(self._every(self._gossip_interval, self._tell_peers))]
        log.info("registry node joined the cluster", extra={"node_id": self.node_id, "url": url,
                                                             "leader": self._leader, "nodes": len(self.nodes)})

    async def stop(self) -> None:
        """Leave at once (the lease revoked: the entry and any lead go with it) rather than after the TTL."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._lease is not None:
            try:
                await self._etcd.request("/v3/lease/revoke", {"ID": str(self._lease)})
            except WalUnavailable:
                log.warning("could not revoke this node's lease; it runs out by itself", extra={"ttl": self._ttl})
        self._term = None
        await self._etcd.close()

    async def _every(self, seconds: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step()
            except WalUnavailable:
                continue  # already reflected in leads() / stale_seconds(); the next step tries again
            except Exception:
                failures = self._step_failures.event()
                if failures:  # a fault that repeats every half second is told once per interval
                    log.exception("cluster step failed; retrying",
                                  extra={"step": getattr(step, "__name__", ""), "events": failures})

    async def _check_secrets_key(self) -> None:
        """Every node must hold the same secrets.key (it opens the sealed signing keys and signs what nodes
        tell each other): the first node leaves a check value of it in etcd, and a node with another key
        refuses to start rather than run half-blind."""
        key = self._prefix + "secrets-key-check"
        check = b64(hmac.new(self._node_key, b"secrets.key check", hashlib.sha256).hexdigest())
        body = {"compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                "success": [{"request_put": {"key": b64(key), "value": check}}],
                "failure": [{"request_range": {"key": b64(key)}}]}
        written = decode(await self._etcd.request("/v3/kv/txn", body), Txn)
        if not written.succeeded and written.responses[0].response_range.kvs[0].value != check:
            raise SecretsKeyError(f"{SECRETS_KEY_FILE} differs from the one the other registry nodes of this cluster "
                                  f"use: copy theirs into this node's data dir (every node needs the same "
                                  f"{SECRETS_KEY_FILE} and admin.key)")

    async def _join(self) -> None:
        sent = time.monotonic()
        granted = decode(await self._etcd.request("/v3/lease/grant", {"TTL": self._ttl}), _Granted)
        self._lease, self._lease_until = granted.ID, sent + granted.TTL
        entry = NodeEntry(node_id=self.node_id, url=self.url, started_at=self._started_at)
        await self._etcd.request("/v3/kv/put", {"key": b64(self._prefix + "nodes/" + self.node_id),
                                                "value": b64(msgspec.json.encode(entry).decode()),
                                                "lease": str(self._lease)})

    async def _keep_alive(self) -> None:
        if self._lease is None:
            await self._join()
            return
        sent = time.monotonic()
        raw = await self._etcd.request("/v3/lease/keepalive", {"ID": str(self._lease)})
        kept = decode(raw.splitlines()[0], _KeepAliveLine).result
        if kept is None or kept.TTL <= 0:
            log.error("this node's lease ran out (cut off from etcd too long); joining again",
                      extra={"node_id": self.node_id, "was_leader": self._term is not None})
            self._term, self._lease = None, None
            await self._join()
            return
        self._lease_until = sent + kept.TTL

    async def _look(self) -> None:
        """One quorum read of the nodes and the leader; campaign when nobody leads."""
        everything = {"key": b64(self._prefix), "range_end": prefix_end(self._prefix)}
        read = decode(await self._etcd.request("/v3/kv/range", everything), Range)
        self._last_view = time.monotonic()
        nodes: dict[str, NodeEntry] = {}
        leader: tuple[str, int] | None = None
        for kv in read.kvs:
            key = unb64(kv.key)
            if key == self._leader_key:
                leader = (unb64(kv.value), kv.create_revision)
            elif key.startswith(self._prefix + "nodes/"):
                try:
                    entry = peer_json.decode(base64.b64decode(kv.value), type=NodeEntry)
                except (msgspec.DecodeError, ValueError):
                    # One unreadable entry (written by hand, or by another version) must not stop this node
                    # from seeing the others, and itself, every half second.
                    self._bad_entries.log(log, logging.ERROR, "unreadable registry node entry in etcd; skipped",
                                          key=key)
                    continue
                nodes[entry.node_id] = entry
        for gone in self.nodes.keys() - nodes.keys():
            log.warning("registry node left the cluster", extra={"node_id": gone})
        if self.gossip is not None:
            # Also any node heard from that this node never saw listed (it died between two looks).
            for gone in (self.nodes.keys() | self.gossip.last_heard.keys()) - nodes.keys() - {self.node_id}:
                self.gossip.forget(gone)
        self.nodes = nodes
        self._follow_leader(leader)
        if leader is None and self._lease is not None and time.monotonic() < self._lease_until:
            await self._campaign()

    def _follow_leader(self, leader: tuple[str, int] | None) -> None:
        holder = leader[0] if leader is not None else None
        if self._term is not None and (leader is None or leader != (self.node_id, self._term)):
            log.error("this node lost the lead", extra={"node_id": self.node_id, "term": self._term,
                                                        "leader": holder})
            self._term = None
        if holder != self._leader:
            log.info("cluster leader", extra={"leader": holder, "node_id": self.node_id})
        self._leader = holder

    async def _campaign(self) -> None:
        body = {"compare": [{"key": b64(self._leader_key), "target": "CREATE", "result": "EQUAL",
                             "create_revision": 0}],
                "success": [{"request_put": {"key": b64(self._leader_key), "value": b64(self.node_id),
                                             "lease": str(self._lease)}}]}
        written = decode(await self._etcd.request("/v3/kv/txn", body), Txn)
        if written.succeeded:
            self._term, self._leader = written.header.revision, self.node_id
            self.terms_won += 1
            log.warning("this node leads the cluster now: it runs the health sweep and evictions",
                        extra={"node_id": self.node_id, "term": self._term})

    async def _mind_staleness(self) -> None:
        """Going stale ends every watch stream here, so routers move to a node that knows more (this one
        refuses new streams until it is current again)."""
        stale = self.stale_seconds()
        if stale is not None and not self._said_stale:
            log.error("this registry node cannot reach etcd: its view may be stale; watch streams ended",
                      extra={"node_id": self.node_id, "stale_seconds": stale})
            self._hub.end_streams()
        elif stale is None and self._said_stale:
            log.warning("this registry node reaches etcd again: its view is current", extra={"node_id": self.node_id})
        self._said_stale = stale is not None

    def hear(self, body: bytes, signature: str | None) -> None:
        if self.gossip is None:
            raise ApiError(503, "starting", "This registry node is still joining its cluster")
        self.gossip.receive(body, signature)

    async def _tell_peers(self) -> None:
        assert self.gossip is not None
        peers = {node_id: entry.url for node_id, entry in self.nodes.items() if node_id != self.node_id}
        await self.gossip.round(peers)

    # What /cluster says.

    async def _endpoint_health(self, url: str) -> EtcdEndpoint:
        started = time.monotonic()
        try:
            async with self._etcd.session.get(f"{url}/health", timeout=_HEALTH_TIMEOUT) as response:
                health = peer_json.decode(await response.read(), type=_Health)
        except TimeoutError:
            return EtcdEndpoint(url=url, healthy=False, error=f"no answer within {_HEALTH_TIMEOUT.total}s")
        except (aiohttp.ClientError, msgspec.DecodeError) as exc:
            return EtcdEndpoint(url=url, healthy=False, error=(str(exc) or type(exc).__name__)[:200])
        rtt = round((time.monotonic() - started) * 1000, 2)
        return EtcdEndpoint(url=url, healthy=health.health == "true", rtt_ms=rtt,
                            error=None if health.health == "true" else "member reports no quorum or no leader")

    async def view(self) -> ClusterView:
        endpoints = await asyncio.gather(*(self._endpoint_health(url) for url in self._etcd.endpoints))
        now = time.monotonic()
        heard = self.gossip.last_heard if self.gossip is not None else {}
        nodes = [NodeView(node_id=entry.node_id, url=entry.url, started_at=entry.started_at,
                          leader=self.leads() if entry.node_id == self.node_id else entry.node_id == self._leader,
                          this_node=entry.node_id == self.node_id,
                          last_heard=round(now - heard[entry.node_id], 3) if entry.node_id in heard else None)
                 for entry in sorted(self.nodes.values(), key=lambda entry: entry.started_at)]
        return ClusterView(store="etcd", node_id=self.node_id, leader=self._leader, stale_seconds=self.stale_seconds(),
                           nodes=nodes, etcd=list(endpoints), routers=router_views(self._hub.routers()),
                           instances=len(self._registry.state.keys.live))
