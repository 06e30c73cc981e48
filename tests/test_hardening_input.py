"""Hostile input at the HTTP layer gets a 4xx JSON error on registry, router and console alike:
non-UTF-8 credential headers, bodies that do not decode, oversized request lines, numbers past 64 bits."""

from __future__ import annotations

import pytest

from console_support import Rig
from hardening_support import RawAnswer, raw_request

UNDECODABLE = b"\xff\xfe"
FRAME = b'{"capability": "echo", "payload": {}}'


def assert_json_error(answer: RawAnswer, status: int, field: str | None = None) -> dict:
    assert answer.status == status, (answer.status, answer.body)
    assert answer.headers["Content-Type"].startswith("application/json"), answer.headers
    body = answer.json()
    assert (body.get("error") or body.get("error_code")) and (body.get("message") or body.get("error_message")), body
    if field is not None:
        assert body["field"] == field, body
    return body


def servers(rig: Rig) -> dict[str, tuple[str, str, str]]:
    """Each server, an endpoint that needs a credential there, and its method."""
    return {"registry": (rig.mesh.registry.url, "GET", "/agents"), "router": (rig.mesh.url, "POST", "/atp"),
            "console": (rig.url, "GET", "/api/overview")}


@pytest.mark.parametrize("header", [b"X-API-Key: ", b"Authorization: Bearer "], ids=["api-key", "bearer"])
async def test_an_undecodable_credential_header_is_a_401_everywhere(auth_rig: Rig, header: bytes):
    for name, (url, method, path) in servers(auth_rig).items():
        name_part, value_prefix = header.split(b": ")
        answer = await raw_request(url, method, path, [(name_part, value_prefix + UNDECODABLE)], FRAME)
        assert_json_error(answer, 401), name


async def test_an_undecodable_admin_key_is_a_401_on_admin_endpoints(auth_rig: Rig):
    for url, path in ((auth_rig.mesh.url, "/reach"), (auth_rig.mesh.registry.url, "/tokens")):
        answer = await raw_request(url, "GET", path, [(b"X-API-Key", UNDECODABLE)])
        assert_json_error(answer, 401, "Authorization")


async def test_undecodable_basic_credentials_are_refused_at_the_token_endpoint(auth_rig: Rig):
    answer = await raw_request(auth_rig.mesh.url, "POST", "/oauth/token",
                               [(b"Authorization", b"Basic " + UNDECODABLE),
                                (b"Content-Type", b"application/x-www-form-urlencoded")],
                               b"grant_type=client_credentials")
    assert answer.status in (400, 401), answer.body
    assert answer.json()["error"]


def body_endpoints(rig: Rig) -> dict[str, tuple[str, str, list[tuple[bytes, bytes]]]]:
    """Each server, an endpoint that reads a JSON body, and the headers that get it read."""
    admin = [(b"X-API-Key", rig.admin_key.encode())]
    return {"registry": (rig.mesh.registry.url, "/register", admin), "router": (rig.mesh.url, "/atp", admin),
            "console": (rig.url, "/api/session", [])}


async def test_a_body_that_is_not_the_gzip_it_claims_is_a_400_everywhere(auth_rig: Rig):
    revision = auth_rig.mesh.registry.store.revision
    for name, (url, path, headers) in body_endpoints(auth_rig).items():
        answer = await raw_request(url, "POST", path, [*headers, (b"Content-Type", b"application/json"),
                                                       (b"Content-Encoding", b"gzip")], FRAME)
        body = assert_json_error(answer, 400, "body")
        assert body["error"] == "invalid_body" and "gzip" in body["message"], name
    assert auth_rig.mesh.registry.store.revision == revision


@pytest.mark.parametrize("where", ["url", "header"])
async def test_an_oversized_request_line_is_a_json_400_everywhere(auth_rig: Rig, where: str):
    long = b"a" * 40_000
    for name, (url, method, path) in servers(auth_rig).items():
        if where == "url":
            answer = await raw_request(url, method, path, target=path.encode() + b"?q=" + long)
        else:
            answer = await raw_request(url, method, path, [(b"X-Long", long)])
        body = assert_json_error(answer, 400)
        assert body["error"] == "line_too_long", name
        assert (await raw_request(url, "GET", "/healthz" if name != "console" else "/")).status == 200, name


async def test_a_url_over_8_kib_is_a_json_error_on_registry_and_console(auth_rig: Rig):
    """The registry and console keep aiohttp's 8 KiB line limit (the router allows 32 KiB lines)."""
    for url, path in ((auth_rig.mesh.registry.url, "/agents"), (auth_rig.url, "/api/overview")):
        answer = await raw_request(url, "GET", path, target=path.encode() + b"?q=" + b"a" * 9000)
        assert assert_json_error(answer, 400)["error"] == "line_too_long"
