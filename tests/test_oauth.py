"""OAuth2 client credentials on the router: a real OAuth2 client library gets a JWT from /oauth/token
and calls through with it; every kind of bad token is refused; signing keys rotate without
breaking the tokens already out.

Bad tokens are forged with pyjwt. Those that must fail on a claim (expiry, audience, ...) are signed
with the router's real key, taken from the running router, so the claim is the only thing wrong.
"""

from __future__ import annotations

import base64
import json
import time

import httpx2
import jwt
import pytest
from authlib.integrations.httpx_client import AsyncOAuth2Client
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import wait_for
from oauth_support import (
    bearer,
    claims,
    hs256_with_public_key,
    router_key,
    signed,
    tampered,
    token_for,
    token_request,
    unsigned,
)
from router.keyring import KeyRing, KeyRingError


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_a_real_oauth2_client_gets_a_token_and_calls_through_with_it(secure, method):
    mesh, agent = secure
    client = await mesh.new_client(["echo", "other.*"])
    async with AsyncOAuth2Client(client["client_id"], client["client_secret"], token_endpoint_auth_method=method,
                                 trust_env=False) as oauth:
        token = await oauth.fetch_token(f"{mesh.url}/oauth/token", grant_type="client_credentials")
        assert token["token_type"] == "Bearer" and token["expires_in"] == 3600
        assert token["scope"] == "echo other.*"
        answer = await oauth.post(f"{mesh.url}/atp", json={"capability": "echo", "payload": {"n": 1},
                                                           "request_id": f"jwt-{method}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["echo"] == {"n": 1}
    assert agent.calls == 1
    assert (await mesh.get(f"/traces/jwt-{method}"))["call"]["caller"] == client["client_id"]


async def test_the_token_response_is_not_cached_and_its_jwt_verifies_with_the_published_keys(secure):
    mesh, _ = secure
    client = await mesh.new_client(["echo"], trust_level="user_authorized")
    status, body, headers = await token_request(mesh, {"grant_type": "client_credentials"}, auth=None,
                                                 headers={"Authorization": "Basic " + base64.b64encode(
                                                     f"{client['client_id']}:{client['client_secret']}".encode()
                                                 ).decode()})
    assert status == 200 and headers["Cache-Control"] == "no-store"
    async with mesh.http.get(f"{mesh.url}/.well-known/jwks.json") as response:
        jwks = await response.json()
    header = jwt.get_unverified_header(body["access_token"])
    assert header["alg"] == "Ed25519" and header["kid"] == jwks["keys"][0]["kid"]
    # pyjwt 2.x reads a JWK by its alg and knows Ed25519 only as EdDSA: name the algorithm for it.
    public = jwt.PyJWK(jwks["keys"][0], algorithm="EdDSA").key
    decoded = jwt.decode(body["access_token"], public, algorithms=["Ed25519"], audience="agentreach",
                         issuer="agentreach-router")
    assert decoded["sub"] == client["client_id"] and decoded["trust_level"] == "user_authorized"
    assert decoded["grants"] == ["echo"] and decoded["exp"] - decoded["iat"] == 3600
    assert decoded["nbf"] == decoded["iat"] and decoded["jti"]


async def test_token_request_errors_follow_rfc_6749(secure):
    mesh, _ = secure
    client = await mesh.new_client(["echo"])
    good = {"grant_type": "client_credentials", "client_id": client["client_id"],
            "client_secret": client["client_secret"]}
    basic = {"Authorization": "Basic " + base64.b64encode(f"{client['client_id']}:wrong".encode()).decode()}
    status, body, headers = await token_request(mesh, {"grant_type": "client_credentials"}, basic)
    assert (status, body["error"]) == (401, "invalid_client")
    assert headers["WWW-Authenticate"].startswith("Basic")
    cases = [
        ({**good, "client_secret": "arc_wrong"}, None, 401, "invalid_client"),
        ({"grant_type": "client_credentials"}, None, 401, "invalid_client"),
        ({**good, "grant_type": "password"}, None, 400, "unsupported_grant_type"),
        ({k: v for k, v in good.items() if k != "grant_type"}, None, 400, "invalid_request"),
        (good, {"Authorization": basic["Authorization"]}, 400, "invalid_request"),  # two client auth methods
        ({**good, "scope": "echo secret.read"}, None, 400, "invalid_scope"),
        ({**good, "scope": "e*"}, None, 400, "invalid_scope"),
    ]
    for form, headers, want_status, error in cases:
        status, body, _ = await token_request(mesh, form, headers)
        assert (status, body["error"]) == (want_status, error), (form, body)
        assert body["error_description"] and "field" in body
    async with mesh.http.post(f"{mesh.url}/oauth/token", json=good) as response:
        assert response.status == 400 and (await response.json())["error"] == "invalid_request"
    async with mesh.http.post(f"{mesh.url}/oauth/token?grant_type=client_credentials",
                              data="grant_type=client_credentials&grant_type=client_credentials",
                              headers={"Content-Type": "application/x-www-form-urlencoded"}) as response:
        assert response.status == 400 and (await response.json())["field"] == "grant_type"


async def test_scope_narrows_what_the_token_may_call(secure, start_agent):
    mesh, agent = secure
    other = await start_agent("other-1")
    await mesh.add(other, "other.thing")
    client = await mesh.new_client(["echo", "other.*"])
    token = await token_for(mesh, client, scope="echo")
    assert (await mesh.call("echo", headers=bearer(token))).status == 200
    narrowed = await mesh.call("other.thing", headers=bearer(token))
    assert narrowed.status == 403 and narrowed.body["error_code"] == "FORBIDDEN"
    # The client's API key still carries every grant.
    assert (await mesh.call("other.thing", headers={"X-API-Key": client["api_key"]})).status == 200
    prefix = await token_for(mesh, client, scope="other.thing")
    assert (await mesh.call("other.thing", headers=bearer(prefix))).status == 200
    assert (agent.calls, other.calls) == (1, 2)


async def test_a_token_forged_with_the_routers_key_and_good_claims_is_accepted(secure):
    """The control for the refusals below: each changes one thing from this."""
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    assert (await mesh.call("echo", headers=bearer(signed(mesh, claims(client))))).status == 200
    assert agent.calls == 1


FORGERIES = {
    "tampered payload": lambda mesh, client: tampered(signed(mesh, claims(client))),
    "expired": lambda mesh, client: signed(mesh, claims(client, iat=int(time.time()) - 600,
                                                        nbf=int(time.time()) - 600, exp=int(time.time()) - 120)),
    "not yet valid": lambda mesh, client: signed(mesh, claims(client, nbf=int(time.time()) + 120)),
    "wrong audience": lambda mesh, client: signed(mesh, claims(client, aud="someone-else")),
    "wrong issuer": lambda mesh, client: signed(mesh, claims(client, iss="https://evil.example")),
    "no expiry": lambda mesh, client: signed(mesh, {k: v for k, v in claims(client).items() if k != "exp"}),
    "alg none": lambda mesh, client: unsigned({"alg": "none", "typ": "JWT", "kid": router_key(mesh).kid},
                                              claims(client)) + ".",
    "HS256 signed with the public key": lambda mesh, client: hs256_with_public_key(mesh, claims(client)),
    "foreign key, valid-looking kid": lambda mesh, client: jwt.encode(
        claims(client), Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": router_key(mesh).kid}),
    "unknown kid": lambda mesh, client: jwt.encode(claims(client), router_key(mesh).private, algorithm="EdDSA",
                                                   headers={"kid": "0-deadbeef"}),
    "not a JWT": lambda mesh, client: "not.a.jwt",
}


REASONS = {
    "tampered payload": "Signature verification failed", "expired": "expired", "not yet valid": "not yet valid",
    "wrong audience": "Audience", "wrong issuer": "issuer", "no expiry": '"exp"', "alg none": "signed with Ed25519",
    "HS256 signed with the public key": "signed with Ed25519",
    "foreign key, valid-looking kid": "Signature verification failed", "unknown kid": "unknown or retired",
    "not a JWT": "not a JWT",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_bad_tokens_are_refused(secure, forgery):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    answer = await mesh.call("echo", headers=bearer(FORGERIES[forgery](mesh, client)))
    assert answer.status == 401, answer.body
    assert answer.body["error_code"] == "UNAUTHENTICATED"
    assert REASONS[forgery] in answer.body["error_message"]
    assert agent.calls == 0


async def test_a_disabled_or_rotated_clients_tokens_stop_working(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    token = await token_for(mesh, client)
    assert (await mesh.call("echo", headers=bearer(token))).status == 200  # now cached
    await mesh.client_action(client["client_id"], "disable")
    refused = await mesh.call("echo", headers=bearer(token))
    assert refused.status == 401 and "disabled" in refused.body["error_message"]
    status, body, _ = await token_request(mesh, {"grant_type": "client_credentials",
                                                 "client_id": client["client_id"],
                                                 "client_secret": client["client_secret"]})
    assert (status, body["error"]) == (401, "invalid_client")
    await mesh.client_action(client["client_id"], "enable")
    assert (await mesh.call("echo", headers=bearer(token))).status == 200
    await wait_for(lambda: int(time.time()) > json.loads(base64.urlsafe_b64decode(
        token.split(".")[1] + "==="))["iat"], timeout=3, what="a second to pass since the token was issued")
    rotated = await mesh.client_action(client["client_id"], "rotate")
    assert (await mesh.call("echo", headers=bearer(token))).status == 401
    assert (await mesh.call("echo", headers=bearer(await token_for(mesh, rotated)))).status == 200
    assert agent.calls == 3


async def test_key_rotation_keeps_old_tokens_until_they_expire(start_mesh, start_agent):
    mesh = await start_mesh(auth=True, router_settings={"token_ttl_seconds": 3, "token_leeway_seconds": 0})
    await mesh.add(await start_agent("echo-1"), "echo")
    client = await mesh.new_client(["echo"])
    old = await token_for(mesh, client)
    async with mesh.http.post(f"{mesh.url}/oauth/keys/rotate", headers={"X-API-Key": client["api_key"]}) as response:
        assert response.status == 403
    async with mesh.http.post(f"{mesh.url}/oauth/keys/rotate", headers=mesh.admin) as response:
        assert response.status == 200
        rotated = await response.json()
    old_kid = jwt.get_unverified_header(old)["kid"]
    assert rotated["kid"] != old_kid
    assert {key["kid"] for key in rotated["jwks"]["keys"]} == {old_kid, rotated["kid"]}
    assert (await mesh.call("echo", headers=bearer(old))).status == 200
    new = await token_for(mesh, client)
    assert jwt.get_unverified_header(new)["kid"] == rotated["kid"]
    assert (await mesh.call("echo", headers=bearer(new))).status == 200

    async def old_refused() -> bool:
        return (await mesh.call("echo", headers=bearer(old))).status == 401
    await wait_for(old_refused, timeout=6, interval=0.1, what="the old token to expire")

    async def old_key_dropped() -> bool:
        async with mesh.http.get(f"{mesh.url}/.well-known/jwks.json") as response:
            return [key["kid"] for key in (await response.json())["keys"]] == [rotated["kid"]]
    await wait_for(old_key_dropped, timeout=6, interval=0.1, what="the old key to leave the JWKS")
    fresh = await token_for(mesh, client)
    assert (await mesh.call("echo", headers=bearer(fresh))).status == 200


async def test_keys_in_keys_dir_survive_a_restart(start_mesh, start_agent, tmp_path):
    keys_dir = tmp_path / "keys"
    mesh = await start_mesh(auth=True, router_settings={"keys_dir": keys_dir})
    await mesh.add(await start_agent("echo-1"), "echo")
    client = await mesh.new_client(["echo"])
    token = await token_for(mesh, client)
    (pem,) = keys_dir.glob("*.pem")
    assert pem.stat().st_mode & 0o777 == 0o600
    await mesh.router_server.stop()
    again = await start_mesh(auth=True, registry=mesh.registry, router_settings={"keys_dir": keys_dir})
    await wait_for(lambda: client["client_id"] in again.router.mirror.auth.clients, timeout=5,
                   what="the new router to learn the client")
    assert (await again.call("echo", headers=bearer(token))).status == 200


def test_a_key_file_others_can_read_is_refused(tmp_path):
    KeyRing(tmp_path, ttl=60, leeway=0).load()
    (pem,) = tmp_path.glob("*.pem")
    pem.chmod(0o644)
    with pytest.raises(KeyRingError, match="chmod 600"):
        KeyRing(tmp_path, ttl=60, leeway=0).load()


async def test_the_oauth_client_library_sees_invalid_client_for_a_wrong_secret(secure):
    mesh, _ = secure
    client = await mesh.new_client(["echo"])
    async with AsyncOAuth2Client(client["client_id"], "arc_wrong", trust_env=False) as oauth:
        with pytest.raises(Exception, match="invalid_client"):
            await oauth.fetch_token(f"{mesh.url}/oauth/token", grant_type="client_credentials")
    async with httpx2.AsyncClient(trust_env=False) as plain:
        answer = await plain.post(f"{mesh.url}/atp", json={"capability": "echo"},
                                  headers={"Authorization": "Bearer"})
    assert answer.status_code == 401


async def test_every_router_accepts_every_routers_tokens_through_the_published_keys(start_mesh, start_agent):
    short = {"token_ttl_seconds": 3, "token_leeway_seconds": 0}
    first = await start_mesh(follow="http", auth=True, router_settings=short)
    second = await start_mesh(follow="http", auth=True, registry=first.registry, router_settings=short)
    agent = await start_agent("echo-1")
    await first.add(agent, "echo")
    await wait_for(lambda: second.router.mirror.offers("echo"), what="the second router to see the agent")
    client = await first.new_client(["echo"])
    await wait_for(lambda: second.router.mirror.auth.clients.get(client["client_id"]), what="the client everywhere")
    from_first = await token_for(first, client)
    kid = jwt.get_unverified_header(from_first)["kid"]
    await wait_for(lambda: kid in second.router.mirror.auth.published_keys, what="the first router's key published")
    assert (await second.call("echo", headers=bearer(from_first))).status == 200
    async with second.http.get(f"{second.url}/.well-known/jwks.json") as response:
        assert kid in {key["kid"] for key in (await response.json())["keys"]}

    # The first router rotates: its old key stays valid everywhere until its tokens have expired.
    async with first.http.post(f"{first.url}/oauth/keys/rotate", headers=first.admin) as response:
        assert response.status == 200
    await wait_for(lambda: second.router.mirror.auth.published_keys[kid].verify_until is not None,
                   what="the old key's end published")
    assert (await second.call("echo", headers=bearer(from_first))).status == 200

    async def refused_everywhere() -> bool:
        return (await second.call("echo", headers=bearer(from_first))).status == 401
    await wait_for(refused_everywhere, timeout=8, interval=0.1, what="the old token to expire at the second router")


async def test_publishing_keys_needs_the_admin_key_and_well_formed_keys(start_registry, http):
    registry = await start_registry(auth=True)
    good = [{"kid": "1795977423326-2ef907f9", "x": "A" * 43}]
    async with http.put(f"{registry.url}/signing-keys", json=good) as response:
        assert response.status == 401
    admin = {"X-API-Key": registry.new_admin_key}
    for bad, field in (([{"kid": "../etc", "x": "A" * 43}], "[0].kid"), ([{"kid": "1-a", "x": "short"}], "[0].x"),
                       ([{"kid": "1-a", "x": "A" * 43, "private": "d"}], "[0].private")):
        async with http.put(f"{registry.url}/signing-keys", json=bad, headers=admin) as response:
            body = await response.json()
            assert (response.status, body["field"]) == (400, field), body
    async with http.put(f"{registry.url}/signing-keys", json=good, headers=admin) as response:
        assert response.status == 200
    async with http.get(f"{registry.url}/signing-keys", headers=admin) as response:
        assert (await response.json())["keys"] == [{**good[0], "verify_until": None}]
