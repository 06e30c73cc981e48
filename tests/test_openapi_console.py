"""The console's OpenAPI document: every route declared, served at /openapi.json (no sign-in needed) as valid
OpenAPI 3.1, and schemathesis against the running console (auth on, signed in with the admin key as a
header, over a running mesh) finds no 5xx and no answer off its schema."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from console.api import ConsoleApi
from console.models import ConsoleConfig
from console.openapi import ADMIN
from console.signin import Gatekeeper
from console_support import Rig
from openapi_support import SELF, declared, fuzz, served, served_document


async def test_every_route_is_declared(auth_rig: Rig, http: aiohttp.ClientSession) -> None:
    """A route added to console/api.py or console/signin.py without a declaration fails here."""
    console = auth_rig.console
    collector = console.collector
    assert collector is not None
    config = ConsoleConfig(
        auth="on", registry_url=auth_rig.mesh.registry.url, router_url=auth_rig.mesh.url, poll_interval=1.0
    )
    api = ConsoleApi(
        config,
        collector,
        console.store,
        console.hub,
        collector.registry,
        collector.router,
        console.connections,
        Gatekeeper(None, collector.registry),
    )
    spec = await served_document(http, console.url)
    assert declared(spec) == served(api.app())


async def test_schemathesis_finds_nothing(auth_rig: Rig, http: aiohttp.ClientSession) -> None:
    assert auth_rig.admin_key is not None
    admin = {"X-API-Key": auth_rig.admin_key}

    def credentials(method: str, path: str, security: list[str]) -> Mapping[str, str] | None:
        # The event stream never ends.
        if path == "/api/stream":
            return None
        return admin if set(security) == set(ADMIN) else {}

    spec = await served_document(http, auth_rig.url)
    assert await fuzz(auth_rig.url, credentials) == declared(spec) - {SELF, ("GET", "/api/stream")}
