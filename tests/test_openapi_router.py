"""The router's OpenAPI document: every route declared (with and without authentication and an audit trail),
served at /openapi.json as valid OpenAPI 3.1, and schemathesis against the running router (auth on, an echo
agent behind it, a client's API key and the admin key) finds no 5xx and no answer off its schema."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import aiohttp
import pytest

from agent_support import Agent
from openapi_support import SELF, declared, fuzz, served, served_document
from router.api import create_app
from router.openapi import ADMIN, CALLER
from router_support import StartMesh

StartAgent = Callable[..., Awaitable[Agent]]


@pytest.mark.parametrize("auth", [True, False])
@pytest.mark.parametrize("audit", [True, False])
async def test_every_route_is_declared(
    start_mesh: StartMesh, http: aiohttp.ClientSession, tmp_path: Path, auth: bool, audit: bool
) -> None:
    """A route added to router/api.py without a declaration fails here."""
    settings = {"audit_path": tmp_path / "audit.db"} if audit else {}
    mesh = await start_mesh(auth=auth, router_settings=settings)
    app = create_app(mesh.router, auth=mesh.router_server.auth)
    spec = await served_document(http, mesh.url)
    assert declared(spec) == served(app)
    assert (("GET", "/audit") in declared(spec)) is audit
    assert (("POST", "/oauth/token") in declared(spec)) is auth


async def test_schemathesis_finds_nothing(
    start_mesh: StartMesh, start_agent: StartAgent, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    mesh = await start_mesh(auth=True, router_settings={"audit_path": tmp_path / "audit.db"})
    await mesh.add(await start_agent("echo-1"), "echo")
    assert mesh.admin_key is not None
    admin = {"X-API-Key": mesh.admin_key}
    caller = {"X-API-Key": (await mesh.new_client(["echo"]))["api_key"]}

    def credentials(method: str, path: str, security: list[str]) -> Mapping[str, str] | None:
        if set(security) == set(ADMIN):
            return admin
        return caller if set(security) == set(CALLER) else {}

    spec = await served_document(http, mesh.url)
    assert await fuzz(mesh.url, credentials) == declared(spec) - {SELF}
