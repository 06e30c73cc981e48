"""Forward signing: the pure sign/verify functions, and the router signing what it forwards.

The router side runs a real registry (auth on), a real router following it (caller auth off:
signing works regardless) and a recording agent on 127.0.0.1 that keeps each request's raw bytes,
so the test checks the signature exactly as an agent would.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from agent_reach.guard import SeenNonces
from agent_reach.headers import SIGNATURE_HEADER
from agent_reach.signing import sign, signature, signing_key, verify
from aiohttp import web

from conftest import wait_for
from recording_support import Received, RecordingServer
from registry.server import RegistryServer
from router.server import RouterServer, RouterServerSettings
from sdk_support import issue_token

KEY = signing_key("art_example-token")
AGENT = "echo-1"
NOW = 1_800_000_000.0


def test_the_key_is_the_registry_s_derivation():
    token = "art_" + "x" * 43
    expected = hmac.new(token.encode(), b"agentreach forward signing v1", hashlib.sha256).hexdigest()
    assert signing_key(token) == expected
    assert signing_key(token + "y") != expected


def test_a_signature_verifies_for_exactly_the_request_it_signs():
    header = sign(KEY, AGENT, "POST", "/atp/echo", "req-1", b'{"payload":1}', now=NOW)
    version, stamp, nonce, digest = header.split(",")
    assert version == "v2" and stamp == f"t={int(NOW)}" and len(nonce) == 2 + 24 and len(digest) == 2 + 64
    assert sign(KEY, AGENT, "POST", "/atp/echo", "req-1", b'{"payload":1}', now=NOW) != header, \
        "a fresh nonce each time"
    assert verify(header, KEY, AGENT, "POST", "/atp/echo", "req-1", b'{"payload":1}', now=NOW + 1) is None
    mismatch = "signature does not match"
    changed = [("GET", "/atp/echo", "req-1", b'{"payload":1}'), ("POST", "/atp/other", "req-1", b'{"payload":1}'),
               ("POST", "/atp/echo", "req-2", b'{"payload":1}'), ("POST", "/atp/echo", "req-1", b'{"payload":2}')]
    for method, path, request_id, body in changed:
        assert verify(header, KEY, AGENT, method, path, request_id, body, now=NOW).startswith(mismatch)
    assert verify(header, signing_key("art_another"), AGENT, "POST", "/atp/echo", "req-1", b'{"payload":1}',
                  now=NOW).startswith(mismatch)


def test_the_window_bounds_a_signature_s_age_both_ways():
    header = sign(KEY, AGENT, "POST", "/p", "r", b"", now=NOW)
    assert verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW + 60) is None
    assert verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW - 60) is None
    assert verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW + 61).startswith(
        "stale signature: signed 61 s ago")
    assert verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW - 61).startswith(
        "stale signature: signed 61 s in the future")
    assert verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW + 200, window_s=300) is None


NONCE = "0123456789abcdef01234567"


@pytest.mark.parametrize("header", [None, "", f"v3,t=1800000000,n={NONCE},s=" + "0" * 64,
                                    f"v2,t=soon,n={NONCE},s=" + "0" * 64, f"v2,t=1800000000,n={NONCE},s=abc",
                                    "v2,t=1800000000,s=" + "0" * 64, "v2,t=1800000000,n=zz,s=" + "0" * 64,
                                    "v2", "garbage"])
def test_a_missing_or_malformed_header_is_refused_with_its_reason(header):
    reason = verify(header, KEY, AGENT, "POST", "/p", "r", b"", now=NOW)
    assert reason is not None
    assert reason.startswith("missing" if not header else "malformed")


def test_a_signature_for_another_timestamp_does_not_verify():
    # Moving the stamp within the window must not keep the signature valid: t is signed too.
    digest = signature(KEY, int(NOW), NONCE, AGENT, "POST", "/p", "r", b"x")
    assert verify(f"v2,t={int(NOW) + 1},n={NONCE},s={digest}", KEY, AGENT, "POST", "/p", "r", b"x", now=NOW).startswith(
        "signature does not match")
    assert verify(f"v2,t={int(NOW)},n={'f' * 24},s={digest}", KEY, AGENT, "POST", "/p", "r", b"x", now=NOW).startswith(
        "signature does not match"), "the nonce is signed too"
    assert verify(f"v2,t={int(NOW)},n={NONCE},s={digest.upper()}", KEY, AGENT, "POST", "/p", "r", b"x", now=NOW) is None


def test_a_nonce_is_accepted_once_while_its_signature_could_verify():
    seen = SeenNonces(window_s=60, limit=3)
    assert seen.first_time("a" * 24, int(NOW), NOW)
    assert not seen.first_time("a" * 24, int(NOW), NOW + 59), "a replay inside the window"
    assert seen.first_time("b" * 24, int(NOW), NOW)
    assert seen.first_time("a" * 24, int(NOW), NOW + 61), "forgotten once its signature is stale anyway"
    for nonce in ("c", "d", "e"):
        assert seen.first_time(nonce * 24, int(NOW) + 61, NOW + 61)
    assert len(seen) == 3, "bounded: the oldest go first"


async def answer_ok(request: web.Request, received: Received) -> web.Response:
    """Answer an ATP frame (at /atp/call) or REST JSON (at /rest/call) with success."""
    if received.path == "/atp/call":
        return web.json_response({"request_id": received.json()["request_id"], "status": "success", "result": "ok"})
    return web.json_response("ok")


class SigningMesh(msgspec.Struct, kw_only=True):
    registry: RegistryServer
    router: RouterServer
    recorder: RecordingServer
    http: aiohttp.ClientSession

    @property
    def admin(self) -> dict[str, str]:
        return {"X-API-Key": self.registry.new_admin_key or ""}

    async def join(self, agent_id: str, service: str, token: str | None) -> None:
        """Register the recorder as ``agent_id`` offering ``<service>.atp`` and ``<service>.rest``; heartbeat it."""
        headers = {"Authorization": f"Bearer {token}"} if token else self.admin
        body = {"agent_id": agent_id, "service": service, "base_url": self.recorder.url,
                "capabilities": [{"name": f"{service}.{protocol}", "protocol": protocol,
                                  "endpoint": f"/{protocol}/call"} for protocol in ("atp", "rest")]}
        for path, sent in (("/register", body), ("/heartbeat", {"agent_id": agent_id})):
            async with self.http.post(f"{self.registry.url}{path}", json=sent, headers=headers) as response:
                assert response.status == 200, await response.text()
        states = self.router.mirror.states
        await wait_for(lambda: agent_id in self.router.mirror.instances and agent_id in states
                       and states[agent_id].state == "healthy", what=f"the router to route to {agent_id}")

    async def call(self, capability: str, payload: Any = "hi") -> Received:
        before = len(self.recorder.received)
        async with self.http.post(f"{self.router.url}/atp",
                                  json={"capability": capability, "payload": payload}) as response:
            assert response.status == 200, await response.text()
        [seen] = self.recorder.received[before:]
        return seen


@pytest.fixture
async def signing_mesh(start_registry: Callable[..., Awaitable[RegistryServer]],
                       http: aiohttp.ClientSession) -> AsyncIterator[Callable[..., Awaitable[SigningMesh]]]:
    async with contextlib.AsyncExitStack() as stack:
        async def start(follow: str = "hub", auth: bool = True) -> SigningMesh:
            registry = await start_registry(auth=auth, silence_timeout=30.0, health_interval=30.0)
            settings = RouterServerSettings(port=0, auth=False, registry_key=registry.new_admin_key,
                                            registry_url=registry.url if follow == "http" else None)
            router = RouterServer(settings, hub=registry.hub if follow == "hub" else None)
            await router.start()
            stack.push_async_callback(router.stop)
            recorder = await RecordingServer(answer_ok).start()
            stack.push_async_callback(recorder.stop)
            await wait_for(lambda: router.mirror.synced, what="the router to load the registry")
            return SigningMesh(registry=registry, router=router, recorder=recorder, http=http)

        yield start


@pytest.mark.parametrize("follow", ["hub", "http"])
async def test_the_router_signs_calls_to_an_instance_that_joined_with_a_token(signing_mesh, follow):
    mesh = await signing_mesh(follow)
    issued = await issue_token(mesh.http, mesh.registry.url, mesh.registry.new_admin_key, "alpha")
    await mesh.join("alpha-1", "alpha", issued["token"])
    key = signing_key(issued["token"])
    for protocol in ("atp", "rest"):
        seen = await mesh.call(f"alpha.{protocol}", {"n": 1})
        header = seen.headers[SIGNATURE_HEADER]
        request_id = seen.headers["X-Request-Id"]
        assert verify(header, key, "alpha-1", "POST", f"/{protocol}/call", request_id, seen.body) is None
        # The signature is this request's, not a reusable pass.
        assert verify(header, key, "alpha-1", "POST", f"/{protocol}/call", seen.headers["X-Request-Id"],
                      seen.body + b" ") is not None


async def test_no_signature_without_a_token_or_after_revocation(signing_mesh):
    mesh = await signing_mesh()
    # An operator registering with the admin key binds no token: nothing to sign with.
    await mesh.join("ops-1", "ops", token=None)
    assert SIGNATURE_HEADER not in (await mesh.call("ops.atp")).headers

    issued = await issue_token(mesh.http, mesh.registry.url, mesh.registry.new_admin_key, "beta")
    await mesh.join("beta-1", "beta", issued["token"])
    assert SIGNATURE_HEADER in (await mesh.call("beta.rest")).headers
    async with mesh.http.post(f"{mesh.registry.url}/tokens/{issued['token_id']}/revoke",
                              headers=mesh.admin) as response:
        assert response.status == 200
    await wait_for(lambda: mesh.router.mirror.auth.signing_key(issued["token_id"]) is None,
                   what="the router to learn of the revocation")
    # Revocation evicts the token's instances, so nothing is sent unsigned in their place.
    seen_before = len(mesh.recorder.received)
    async with mesh.http.post(f"{mesh.router.url}/atp", json={"capability": "beta.rest", "payload": "hi"}) as response:
        assert response.status == 404
        assert (await response.json())["error_code"] == "UNKNOWN_CAPABILITY"
    assert len(mesh.recorder.received) == seen_before


async def test_with_registry_auth_off_nothing_is_signed(signing_mesh):
    mesh = await signing_mesh(auth=False)
    await mesh.join("dev-1", "dev", token=None)
    for protocol in ("atp", "rest"):
        assert SIGNATURE_HEADER not in (await mesh.call(f"dev.{protocol}")).headers


@pytest.mark.parametrize("stamp", ["²", "١٢٣", "9" * 400, "-5", ""])
def test_a_timestamp_that_is_no_plain_number_is_malformed_not_a_crash(stamp):
    """str.isdigit took "²" (int() then raised ValueError) and 400 digits overflowed the window's arithmetic:
    an agent's guard raised on a header any caller could send (found by the Go SDK's fuzzer)."""
    header = f"v2,t={stamp},n={'0' * 24},s={'0' * 64}"
    assert verify(header, "k" * 64, "agent-1", "POST", "/atp/x", "r", b"{}").startswith("malformed X-Reach-Signature")
