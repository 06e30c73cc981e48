"""Assemble and run the console: open its store, start polling the mesh, serve the dashboard."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Literal

import aiohttp
import msgspec
from agent_reach.admission import Gate, Limits
from agent_reach.serving import cancel, close, listen
from aiohttp import web

from console.admin_key import AdminKey
from console.api import ConsoleApi
from console.collector import Collector
from console.headers import security_headers
from console.hub import Hub
from console.models import ConsoleConfig
from console.signin import Gatekeeper, Sessions
from console.store import ConsoleStore
from console.upstream import Upstream
from registry.access import read_admin_key
from weblayer import otel

log = logging.getLogger("agentreach.console")


class ConsoleSettings(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8090
    # One URL or several, comma-separated: the console follows the first it can reach (console/upstream.py).
    registry_url: str = "http://127.0.0.1:8081"
    router_url: str = "http://127.0.0.1:8080"
    data_dir: Path = Path(".agentreach")
    # "on": operators sign in with the admin key. "off" (development): open, with a banner saying so.
    auth: Literal["on", "off"] = "on"
    # Sent to the registry and router (their admin endpoints), and what operators sign in with; after a
    # rotation the console reads DATA_DIR/admin.key again (console/admin_key.py).
    admin_key: str | None = None
    poll_interval: float = 1.0
    # What the listener holds its connections to: deadlines, the cap (agent_reach.connections).
    connections: Limits = msgspec.field(default_factory=Limits)
    # The OTLP/HTTP collector traces go to (weblayer/otel.py); None: the OTEL_* variables decide.
    otlp_endpoint: str | None = None


class ConsoleServer:
    """The console's parts, started and stopped together; its SQLite file is DATA_DIR/console.db."""

    def __init__(self, settings: ConsoleSettings):
        self.settings = settings
        self.store = ConsoleStore(settings.data_dir / "console.db")
        self.hub = Hub()
        self.collector: Collector | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.otlp: otel.Otlp | None = None
        self.port = settings.port
        # The listener's connections, counted for /metrics.
        self.connections = Gate(settings.connections)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        settings = self.settings
        if settings.auth == "on" and not settings.admin_key:
            raise ValueError("a console with auth on needs the admin key (ConsoleSettings.admin_key)")
        await self.store.open()
        self._session = aiohttp.ClientSession()
        admin = AdminKey(settings.admin_key, lambda: read_admin_key(settings.data_dir)) if settings.admin_key else None
        registry = Upstream(self._session, settings.registry_url, admin, judges_admin_key=True)
        router = Upstream(self._session, settings.router_url, admin)
        self.collector = Collector(registry, router, self.store, self.hub, settings.poll_interval)
        await self.collector.load()
        self._task = asyncio.create_task(self.collector.run())
        config = ConsoleConfig(auth=settings.auth, registry_url=",".join(registry.urls.urls),
                               router_url=",".join(router.urls.urls),
                               poll_interval=settings.poll_interval)
        sessions = Sessions(admin) if settings.auth == "on" and admin is not None else None
        api = ConsoleApi(config, self.collector, self.store, self.hub, registry, router, self.connections,
                         Gatekeeper(sessions, registry))
        app = api.app()
        app.on_response_prepare.append(security_headers)
        self.otlp = otel.start("agentreach-console", settings.otlp_endpoint)
        otel.trace_requests(app, self.otlp)
        self._runner, self.port = await listen(app, settings.host, settings.port, gate=self.connections)
        log.info("console listening", extra={"url": self.url, "registry": config.registry_url,
                                            "router": config.router_url, "auth": settings.auth,
                                            "store": str(self.store.path)})

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await cancel(self._task)
        self.hub.close()
        await close(self._runner, self._session)
        await self.store.close()
        await otel.stop(self.otlp)
