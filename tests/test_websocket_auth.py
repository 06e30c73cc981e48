"""Signed forwards over WebSocket, as over HTTP: the router signs each call for the instance it joined as, the
SDK agent serves those and refuses calls that did not come through the mesh, whoever opens the socket."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from agent_reach import ReachClient
from agent_reach.headers import REQUEST_ID_HEADER, SIGNATURE_HEADER
from agent_reach.signing import sign, signing_key
from agent_reach.socket_wire import Envelope, decode, encode

from sdk_support import counting_agent


def socket_counting_agent(make_agent, agent_id: str, mesh, name: str, token: str):
    agent = make_agent(agent_id, mesh.registry.url, registration_token=token)
    ran: list[Any] = []

    @agent.capability(name, protocol="websocket")
    async def echo(payload, ctx):
        ran.append(payload)
        return {"echo": payload}

    return agent, ran


async def call_on_socket(http: aiohttp.ClientSession, url: str, request_id: str, body: bytes,
                         headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """One call sent on a socket this test opens to the agent itself (around the router)."""
    async with http.ws_connect(url) as socket:
        await socket.send_bytes(encode(Envelope(type="call", id=request_id,
                                                headers={REQUEST_ID_HEADER: request_id, **headers}), body))
        message = await socket.receive(timeout=5)
        envelope, frame = decode(message.data)
    assert (envelope.type, envelope.id) == ("reply", request_id)
    return envelope.status, json.loads(frame)


async def test_signed_calls_are_served_and_calls_around_the_router_refused(token_mesh, make_agent):
    issued = await token_mesh.token("wsauth")
    agent, ran = socket_counting_agent(make_agent, "wsauth-1", token_mesh, "wsauth.echo", issued["token"])
    await agent.start()
    await token_mesh.routable("wsauth-1")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("wsauth.echo", {"n": 1}) == {"echo": {"n": 1}}
    assert ran == [{"n": 1}]

    url = f"{agent.base_url}/ws/wsauth.echo"
    key = signing_key(issued["token"])

    def body(request_id: str, payload: Any) -> bytes:
        return json.dumps({"capability": "wsauth.echo", "payload": payload, "request_id": request_id}).encode()

    status, answer = await call_on_socket(token_mesh.http, url, "sneak-1", body("sneak-1", 2), {})
    assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED")
    assert "missing X-Reach-Signature" in answer["error_message"]
    forged = sign(signing_key("art_forged"), "wsauth-1", "POST", "/ws/wsauth.echo", "sneak-2", body("sneak-2", 3))
    status, answer = await call_on_socket(token_mesh.http, url, "sneak-2", body("sneak-2", 3),
                                          {SIGNATURE_HEADER: forged})
    assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED") and "does not match" in answer["error_message"]
    # The positive control: the right key, the registered path, once; its replay is refused.
    genuine = sign(key, "wsauth-1", "POST", "/ws/wsauth.echo", "own-1", body("own-1", 4))
    signed = {SIGNATURE_HEADER: genuine}
    assert (await call_on_socket(token_mesh.http, url, "own-1", body("own-1", 4), signed))[0] == 200
    status, answer = await call_on_socket(token_mesh.http, url, "own-1", body("own-1", 4), signed)
    assert (status, "replayed" in answer["error_message"]) == (401, True)
    assert ran == [{"n": 1}, 4]


async def test_an_http_capability_of_the_same_agent_is_not_reachable_over_its_socket(token_mesh, make_agent):
    issued = await token_mesh.token("wsmix")
    agent, ran = counting_agent(make_agent, "wsmix-1", token_mesh, "wsmix.http", registration_token=issued["token"])
    await agent.start()
    async with token_mesh.http.get(f"{agent.base_url}/ws/wsmix.http") as response:
        assert response.status == 404
    assert ran == []
