"""A router-signed call names the instance it was made for (hardening item 8).

Instances of one service share the signing key (it comes from their registration token) and each
remembers only the nonces it accepted itself, so a signature that did not name its destination
could be replayed to a sibling. Here a real registry (auth on), a real router and two real SDK
agents of one service, each serving a wrapped aiohttp route that keeps what it was sent: a call
captured at one instance is refused by its sibling and, as a replay, by itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from typing import Any

import aiohttp
import msgspec
from agent_reach import AgentReachSDK, ReachClient, register_capability
from agent_reach.headers import SIGNATURE_HEADER
from agent_reach.serving import listen
from agent_reach.signing import signature, signing_key, verify
from aiohttp import web
from multidict import CIMultiDict

from sdk_support import TokenMesh, free_port, issue_token

KEY = signing_key("art_example-token")
NOW = 1_800_000_000.0
NONCE = "0123456789abcdef01234567"


def test_a_signature_verifies_at_the_instance_it_names_only():
    header = f"v2,t={int(NOW)},n={NONCE},s={signature(KEY, int(NOW), NONCE, 'alpha-1', 'POST', '/p', 'r', b'x')}"
    assert verify(header, KEY, "alpha-1", "POST", "/p", "r", b"x", now=NOW) is None
    assert verify(header, KEY, "alpha-2", "POST", "/p", "r", b"x", now=NOW).startswith("signature does not match")


def test_a_genuine_v1_signature_is_refused_by_name():
    # What a router before instance binding sent: no agent_id in the signed string.
    signed = f"{int(NOW)}\n{NONCE}\nPOST\n/p\nr\n{hashlib.sha256(b'x').hexdigest()}"
    v1 = f"v1,t={int(NOW)},n={NONCE},s={hmac.digest(KEY.encode(), signed.encode(), 'sha256').hex()}"
    assert verify(v1, KEY, "alpha-1", "POST", "/p", "r", b"x", now=NOW).startswith(
        f"{SIGNATURE_HEADER} v1 is refused")


class Received(msgspec.Struct):
    headers: CIMultiDict[str]
    body: bytes


async def recording_instance(make: Any, teardown: contextlib.AsyncExitStack, mesh: TokenMesh, agent_id: str,
                             token: str) -> tuple[str, list[Received]]:
    """An SDK agent of service ``alpha`` serving ``alpha.echo`` from an aiohttp route that keeps every
    call it served; labelled ``slot=<agent_id>`` so a caller can steer a call to it. Returns its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agent: AgentReachSDK = make(agent_id, mesh.registry.url, service="alpha", base_url=url,
                                registration_token=token, metadata={"slot": agent_id})
    received: list[Received] = []
    routes = web.RouteTableDef()

    @register_capability(agent, name="alpha.echo")
    @routes.post("/internal/echo")
    async def echo(request: web.Request) -> web.Response:
        received.append(Received(CIMultiDict(request.headers), await request.read()))
        return web.json_response({"served_by": agent_id})

    app = web.Application()
    app.add_routes(routes)
    agent.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    teardown.push_async_callback(runner.cleanup)
    await mesh.routable(agent_id)
    return f"{url}/internal/echo", received


async def replay(http: aiohttp.ClientSession, url: str, captured: Received) -> tuple[int, Any]:
    headers = {name: captured.headers[name] for name in ("X-Request-Id", SIGNATURE_HEADER, "Content-Type")}
    async with http.post(url, data=captured.body, headers=headers) as response:
        return response.status, await response.json()


async def test_a_call_captured_at_one_instance_is_refused_by_its_sibling_and_by_itself(
        token_mesh: TokenMesh, make_agent: Any, teardown: contextlib.AsyncExitStack) -> None:
    issued = await issue_token(token_mesh.http, token_mesh.registry.url, token_mesh.admin["X-API-Key"], "alpha")
    url_a, received_a = await recording_instance(make_agent, teardown, token_mesh, "alpha-a", issued["token"])
    url_b, received_b = await recording_instance(make_agent, teardown, token_mesh, "alpha-b", issued["token"])
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("alpha.echo", {"n": 1}, {"routing_hint": {"slot": "alpha-a"}}) == {
            "served_by": "alpha-a"}
        [captured] = received_a

        status, answer = await replay(token_mesh.http, url_b, captured)
        assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED")
        assert "signature does not match" in answer["error_message"], answer
        status, answer = await replay(token_mesh.http, url_a, captured)
        assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED")
        assert "replayed" in answer["error_message"], answer
        assert received_b == [] and len(received_a) == 1, "neither replay reached a handler"

        for agent_id in ("alpha-a", "alpha-b"):
            assert await client.call("alpha.echo", {"n": 2}, {"routing_hint": {"slot": agent_id}}) == {
                "served_by": agent_id}
    assert len(received_a) == 2 and len(received_b) == 1
