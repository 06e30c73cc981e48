"""The registry's OpenAPI document: every route declared, served at /openapi.json as valid OpenAPI 3.1, and
schemathesis against the running registry (auth on, real credentials) finds no 5xx and no answer off its
schema."""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import aiohttp
import pytest

from conftest import admin_key
from openapi_support import SELF, declared, fuzz, served, served_document
from registry.api import create_app
from registry.openapi import ADMIN, AGENT
from registry.server import RegistryServer
from weblayer.openapi import VERSION

StartRegistry = Callable[..., Awaitable[RegistryServer]]
ROOT = Path(__file__).resolve().parent.parent


def test_the_documents_version_is_the_packages() -> None:
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == VERSION


@pytest.mark.parametrize("auth", [True, False])
async def test_every_route_is_declared(start_registry: StartRegistry, http: aiohttp.ClientSession, auth: bool) -> None:
    """A route added to registry/api.py without a declaration fails here (the admin-key rotation only with auth)."""
    registry = await start_registry(auth=auth)
    assert registry.registry is not None
    app = create_app(registry.registry, auth=auth, data_dir=registry.settings.data_dir)
    spec = await served_document(http, registry.url)
    assert declared(spec) == served(app)
    assert (("POST", "/admin-key/rotate") in declared(spec)) is auth


async def test_schemathesis_finds_nothing(start_registry: StartRegistry, http: aiohttp.ClientSession) -> None:
    registry = await start_registry(auth=True)
    admin = {"X-API-Key": admin_key(registry)}
    async with http.post(f"{registry.url}/tokens", json={"service": "echo"}, headers=admin) as response:
        assert response.status == 201
        agent = {"X-API-Key": (await response.json())["token"]}

    def credentials(method: str, path: str, security: list[str]) -> Mapping[str, str] | None:
        # The feed never ends; a new admin key would lock the rest of the run out.
        if path in ("/watch", "/admin-key/rotate"):
            return None
        if set(security) == set(ADMIN):
            return admin
        return agent if set(security) == set(AGENT) else {}

    spec = await served_document(http, registry.url)
    assert await fuzz(registry.url, credentials) == declared(spec) - {
        SELF,
        ("GET", "/watch"),
        ("POST", "/admin-key/rotate"),
    }
