"""The registry's side of security: the admin key, the admin API for clients and tokens, the gate.

Real registries on loopback with auth on, real WAL files; secrets are checked never to reach disk.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from agent_reach.serving import cancel

from conftest import admin_key, call, registration, wait_for
from registry.server import RegistryServer
from router.feed import follow_http
from router.mirror import RegistryMirror

Start = Callable[..., Awaitable[RegistryServer]]


@pytest.fixture
async def secured(start_registry: Start) -> RegistryServer:
    return await start_registry(auth=True)


async def test_first_start_creates_an_admin_key_file_readable_by_the_owner_only(start_registry: Start,
                                                                                 tmp_path: Path) -> None:
    server = await start_registry(data_dir=tmp_path / "d", auth=True)
    key_file = tmp_path / "d" / "admin.key"
    assert key_file.read_text().strip() == server.new_admin_key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    await server.stop()
    again = await start_registry(data_dir=tmp_path / "d", auth=True)
    assert again.new_admin_key is None, "a second start must not make (or show) a new key"
    assert again.registry is not None and again.registry.state.auth.is_admin(key_file.read_text().strip())


async def test_admin_endpoints_refuse_without_the_admin_key(secured: RegistryServer,
                                                            http: aiohttp.ClientSession) -> None:
    key = admin_key(secured)
    status, client = await call(http, "POST", f"{secured.url}/clients", key,
                                {"name": "weather", "trust_level": "public", "grants": ["weather.now"]})
    assert status == 201
    for method, path in (("GET", "/agents"), ("GET", "/policies"), ("GET", "/clients"), ("POST", "/tokens"),
                         ("GET", "/watch"), ("GET", "/settings/alerts"), ("PUT", "/policies/x")):
        status, body = await call(http, method, f"{secured.url}{path}")
        assert (status, body["error"], body["field"]) == (401, "unauthenticated", "Authorization"), path
        status, body = await call(http, method, f"{secured.url}{path}", "ara_wrong")
        assert (status, body["error"]) == (401, "unauthenticated"), path
        status, body = await call(http, method, f"{secured.url}{path}", client["api_key"])
        assert (status, body["error"]) == (403, "forbidden"), f"a caller's key is not the admin key: {path}"
    for path in ("/healthz", "/metrics"):
        async with http.get(f"{secured.url}{path}") as response:
            assert response.status == 200, path


async def test_clients_are_created_listed_disabled_and_rotated_without_showing_secrets_again(
        secured: RegistryServer, http: aiohttp.ClientSession) -> None:
    key = admin_key(secured)
    status, created = await call(http, "POST", f"{secured.url}/clients", key,
                                 {"name": "orders-app", "trust_level": "user_authorized",
                                  "grants": ["order.*", "weather.now", "order.*"], "rate_limit_qps": 50})
    assert status == 201
    assert set(created) >= {"client_id", "client_secret", "api_key"}
    assert created["grants"] == ["order.*", "weather.now"]
    book = secured.registry.state.auth  # type: ignore[union-attr]
    assert book.client_by_api_key(created["api_key"]).client_id == created["client_id"]

    status, listed = await call(http, "GET", f"{secured.url}/clients", key)
    assert status == 200
    [shown] = listed["clients"]
    assert shown["client_id"] == created["client_id"] and shown["enabled"] is True
    assert not {"client_secret", "api_key", "secret_digest", "api_key_digest"} & set(shown)

    status, disabled = await call(http, "POST", f"{secured.url}/clients/{created['client_id']}/disable", key)
    assert (status, disabled["enabled"]) == (200, False)
    assert book.client_by_api_key(created["api_key"]) is None
    await call(http, "POST", f"{secured.url}/clients/{created['client_id']}/enable", key)

    status, rotated = await call(http, "POST", f"{secured.url}/clients/{created['client_id']}/rotate", key)
    assert status == 200 and rotated["api_key"] != created["api_key"]
    assert rotated["client_secret"] != created["client_secret"]
    assert book.client_by_api_key(created["api_key"]) is None, "the old API key stops at once"
    assert book.client_by_api_key(rotated["api_key"]).client_id == created["client_id"]

    status, body = await call(http, "POST", f"{secured.url}/clients/cli_nope/rotate", key)
    assert (status, body["error"], body["field"]) == (404, "client_not_found", "client_id")


@pytest.mark.parametrize(("grants", "field"), [
    (["*"], "grants[0]"), (["order*"], "grants[0]"), (["ok", ".*"], "grants[1]"), ([], "grants"),
])
async def test_wildcard_and_malformed_grants_are_refused(secured: RegistryServer, http: aiohttp.ClientSession,
                                                         grants: list[str], field: str) -> None:
    key = admin_key(secured)
    status, body = await call(http, "POST", f"{secured.url}/clients", key,
                              {"name": "greedy", "trust_level": "internal", "grants": grants})
    assert (status, body["error"], body["field"]) == (400, "invalid_field", field)
    status, listed = await call(http, "GET", f"{secured.url}/clients", key)
    assert listed["clients"] == [], "nothing half-created"


async def test_bad_trust_level_and_unknown_fields_are_refused(secured: RegistryServer,
                                                              http: aiohttp.ClientSession) -> None:
    key = admin_key(secured)
    status, body = await call(http, "POST", f"{secured.url}/clients", key,
                              {"name": "x", "trust_level": "root", "grants": ["a"]})
    assert (status, body["field"]) == (400, "trust_level")
    status, body = await call(http, "POST", f"{secured.url}/tokens", key, {"service": "a", "admin": True})
    assert (status, body["error"], body["field"]) == (400, "unknown_field", "admin")


async def test_registration_tokens_bind_agents_to_one_service(secured: RegistryServer, http: aiohttp.ClientSession,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentreach.registry.api")
    key = admin_key(secured)
    _, weather = await call(http, "POST", f"{secured.url}/tokens", key, {"service": "weather"})
    _, orders = await call(http, "POST", f"{secured.url}/tokens", key, {"service": "orders"})

    status, body = await call(http, "POST", f"{secured.url}/register", None, registration("w-1", "weather.now"))
    assert (status, body["error"]) == (401, "unauthenticated")
    [refused] = [r for r in caplog.records if r.getMessage() == "request refused"]
    assert (refused.path, refused.error, refused.remote) == ("/register", "unauthenticated", "127.0.0.1")
    status, body = await call(http, "POST", f"{secured.url}/register", weather["token"],
                              registration("w-1", "weather.now"))
    assert status == 200 and body["service"] == "weather"
    status, body = await call(http, "POST", f"{secured.url}/register", orders["token"],
                              registration("o-1", "order.query", service="weather"))
    assert (status, body["error"], body["field"]) == (403, "forbidden", "service")
    status, body = await call(http, "POST", f"{secured.url}/register", orders["token"],
                              registration("o-1", "weather.now"))
    assert (status, body["error"]) == (409, "capability_owned"), "no taking over another service's capability"
    status, body = await call(http, "POST", f"{secured.url}/register", orders["token"],
                              registration("w-1", "order.query"))
    assert (status, body["error"], body["field"]) == (409, "agent_id_taken", "agent_id"), "nor its instances"
    status, body = await call(http, "POST", f"{secured.url}/heartbeat", orders["token"], {"agent_id": "w-1"})
    assert (status, body["error"]) == (403, "forbidden")
    status, body = await call(http, "POST", f"{secured.url}/deregister", orders["token"], {"agent_id": "w-1"})
    assert (status, body["error"]) == (403, "forbidden")
    status, _ = await call(http, "POST", f"{secured.url}/heartbeat", weather["token"], {"agent_id": "w-1"})
    assert status == 200

    status, revoked = await call(http, "POST", f"{secured.url}/tokens/{weather['token_id']}/revoke", key)
    assert (status, revoked["revoked"]) == (200, True)
    status, body = await call(http, "POST", f"{secured.url}/heartbeat", weather["token"], {"agent_id": "w-1"})
    assert (status, body["error"]) == (401, "unauthenticated")
    status, listed = await call(http, "GET", f"{secured.url}/tokens", key)
    assert {t["service"]: t["revoked"] for t in listed["tokens"]} == {"weather": True, "orders": False}
    assert all("token" not in t and "token_digest" not in t for t in listed["tokens"])


async def test_credentials_survive_a_restart_and_only_their_digests_reach_the_disk(start_registry: Start,
                                                                                  tmp_path: Path) -> None:
    data = tmp_path / "durable"
    server = await start_registry(data_dir=data, auth=True)
    key = admin_key(server)
    async with aiohttp.ClientSession() as http:
        _, client = await call(http, "POST", f"{server.url}/clients", key,
                               {"name": "c", "trust_level": "internal", "grants": ["a.b"]})
        _, token = await call(http, "POST", f"{server.url}/tokens", key, {"service": "svc"})
    await server.stop()
    on_disk = b"".join(path.read_bytes() for path in data.rglob("*") if path.is_file() and path.name != "admin.key")
    for secret in (client["client_secret"], client["api_key"], token["token"], key):
        assert secret.encode() not in on_disk
    again = await start_registry(data_dir=data, auth=True)
    book = again.registry.state.auth  # type: ignore[union-attr]
    assert book.client_by_api_key(client["api_key"]).name == "c"
    assert book.token(token["token"]).service == "svc"
    assert book.is_admin(key)


async def test_the_watch_feed_needs_the_admin_key_and_carries_credentials_to_a_router(
        secured: RegistryServer) -> None:
    key = admin_key(secured)
    mirror = RegistryMirror()
    async with aiohttp.ClientSession() as http:
        _, client = await call(http, "POST", f"{secured.url}/clients", key,
                               {"name": "c", "trust_level": "public", "grants": ["x"]})
        follower = asyncio.create_task(follow_http(http, secured.url, mirror, admin_key=key))
        try:
            await wait_for(lambda: mirror.auth.client_by_api_key(client["api_key"]) is not None,
                           what="the client in the router's mirror")
            assert mirror.auth.is_admin(key)
            await call(http, "POST", f"{secured.url}/clients/{client['client_id']}/disable", key)
            await wait_for(lambda: mirror.auth.client_by_api_key(client["api_key"]) is None,
                           what="the disable to reach the mirror")
        finally:
            await cancel(follower)
