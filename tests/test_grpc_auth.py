"""Signed forwards over gRPC, as over HTTP: the router signs the request message's bytes for the instance it
joined as, the SDK agent serves those and refuses calls that did not come through the mesh (missing, forged,
replayed, or made for other bytes), whoever dials its gRPC port."""

from __future__ import annotations

from typing import Any

import grpc
from agent_reach import ReachClient
from agent_reach.headers import REQUEST_ID_HEADER, SIGNATURE_HEADER
from agent_reach.proto.agent_pb2 import CallRequest
from agent_reach.signing import GRPC_SIGNED_PATH, sign, signing_key

from grpc_support import call_directly


def grpc_counting_agent(make_agent, agent_id: str, mesh, token: str):
    agent = make_agent(agent_id, mesh.registry.url, registration_token=token)
    ran: list[Any] = []

    @agent.capability("grpcauth.echo", protocol="grpc")
    async def echo(payload, ctx):
        ran.append(payload)
        return {"echo": payload}

    @agent.capability("grpcauth.http")
    async def over_http(payload, ctx):
        ran.append(("http", payload))
        return payload

    return agent, ran


async def test_signed_calls_are_served_and_calls_around_the_router_refused(token_mesh, make_agent):
    issued = await token_mesh.token("grpcauth")
    agent, ran = grpc_counting_agent(make_agent, "grpcauth-1", token_mesh, issued["token"])
    await agent.start()
    await token_mesh.routable("grpcauth-1")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("grpcauth.echo", {"n": 1}) == {"echo": {"n": 1}}
    assert ran == [{"n": 1}]

    assert agent.grpc_address is not None
    key = signing_key(issued["token"])

    def request(request_id: str, payload: bytes) -> CallRequest:
        return CallRequest(request_id=request_id, capability="grpcauth.echo", payload=payload)

    async def call(request_id: str, message: CallRequest, signature: str | None = None, body: bytes | None = None):
        headers = {REQUEST_ID_HEADER: request_id, **({SIGNATURE_HEADER: signature} if signature else {})}
        return await call_directly(agent.grpc_address, message, headers, body)

    status, details = await call("sneak-1", request("sneak-1", b"2"))
    assert status is grpc.StatusCode.UNAUTHENTICATED and "missing X-Reach-Signature" in details, details
    message = request("sneak-2", b"3")
    forged = sign(signing_key("art_forged"), "grpcauth-1", "POST", GRPC_SIGNED_PATH, "sneak-2",
                  message.SerializeToString())
    status, details = await call("sneak-2", message, forged)
    assert status is grpc.StatusCode.UNAUTHENTICATED and "does not match" in details, details
    # Signed right, for other bytes: a payload changed on its way.
    signed_for = request("sneak-3", b"4").SerializeToString()
    status, details = await call("sneak-3", request("sneak-3", b"5"),
                                 sign(key, "grpcauth-1", "POST", GRPC_SIGNED_PATH, "sneak-3", signed_for))
    assert status is grpc.StatusCode.UNAUTHENTICATED, details
    # The positive control: the right key and bytes, once; its replay is refused.
    genuine = request("own-1", b"6")
    signature = sign(key, "grpcauth-1", "POST", GRPC_SIGNED_PATH, "own-1", genuine.SerializeToString())
    status, reply = await call("own-1", genuine, signature)
    assert status is grpc.StatusCode.OK and not isinstance(reply, str) and reply.result == b'{"echo":6}', reply
    status, details = await call("own-1", genuine, signature)
    assert status is grpc.StatusCode.UNAUTHENTICATED and "replayed" in details, details
    assert ran == [{"n": 1}, 6]


async def test_an_http_capability_of_the_same_agent_is_not_reachable_over_grpc(token_mesh, make_agent):
    issued = await token_mesh.token("grpcauth")
    agent, ran = grpc_counting_agent(make_agent, "grpcauth-2", token_mesh, issued["token"])
    await agent.start()
    await token_mesh.routable("grpcauth-2")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("grpcauth.http", 7) == 7
    message = CallRequest(request_id="cross-1", capability="grpcauth.http", payload=b"8")
    signature = sign(signing_key(issued["token"]), "grpcauth-2", "POST", GRPC_SIGNED_PATH, "cross-1",
                     message.SerializeToString())
    status, details = await call_directly(agent.grpc_address or "", message,
                                          {REQUEST_ID_HEADER: "cross-1", SIGNATURE_HEADER: signature})
    assert status is grpc.StatusCode.NOT_FOUND and "no capability 'grpcauth.http'" in details, details
    assert ran == [("http", 7)]


async def test_a_message_that_is_no_call_request_is_refused_and_the_agent_serves_on(token_mesh, make_agent):
    issued = await token_mesh.token("grpcauth")
    agent, ran = grpc_counting_agent(make_agent, "grpcauth-3", token_mesh, issued["token"])
    await agent.start()
    await token_mesh.routable("grpcauth-3")
    status, details = await call_directly(agent.grpc_address or "", CallRequest(), {}, body=b"\xff\xfe garbage")
    assert status is grpc.StatusCode.INVALID_ARGUMENT and "not an agentreach.v1.CallRequest" in details, details
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("grpcauth.echo", 9) == {"echo": 9}
    assert ran == [9]
