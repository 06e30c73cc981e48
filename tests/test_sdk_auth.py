"""SDK agents with registration tokens: calls must come through the router, and tokens bind services.

A real registry with auth on (tokens issued through its admin API), a real router following it
(caller auth off: the router signs what it forwards either way) and real SDK agents, all on
127.0.0.1. An agent holding a token refuses what the router did not sign, except the declared
direct fallback; a token opens the registry to its own service only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
import pytest
from agent_reach import ReachClient, ReachError, register_capability
from agent_reach.headers import DIRECT_HEADER, SIGNATURE_HEADER
from agent_reach.heartbeat import RegistryRejected
from agent_reach.serving import listen
from agent_reach.signing import sign, signing_key
from aiohttp import web
from fastapi import FastAPI, Request

from conftest import wait_for
from sdk_support import counting_agent, free_port, loopback_socket, post_frame, refused_url, run_uvicorn


def frame_bytes(capability: str, payload: Any, request_id: str) -> bytes:
    return msgspec.json.encode({"capability": capability, "payload": payload, "request_id": request_id})


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.msg == "call_refused"]


async def test_calls_through_the_router_are_served_and_calls_around_it_refused(token_mesh, make_agent, caplog):
    issued = await token_mesh.token("alpha")
    agent, ran = counting_agent(make_agent, "alpha-1", token_mesh, "alpha.echo", registration_token=issued["token"])
    await agent.start()
    await token_mesh.routable("alpha-1")
    caplog.set_level(logging.WARNING, logger="agentreach")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("alpha.echo", {"n": 1}) == {"echo": {"n": 1}}
    assert ran == [{"n": 1}] and refusals(caplog) == []

    endpoint = f"{agent.base_url}/atp/alpha.echo"
    status, answer = await post_frame(token_mesh.http, endpoint, frame_bytes("alpha.echo", {"n": 2}, "sneak-1"),
                                      headers={"X-Request-Id": "sneak-1"})
    assert status == 401 and answer["error_code"] == "UNAUTHENTICATED" and answer["can_retry"] is False
    assert "missing X-Reach-Signature" in answer["error_message"] and answer["request_id"] == "sneak-1"
    assert ran == [{"n": 1}]  # the handler never ran
    [refused] = refusals(caplog)
    assert (refused.capability, refused.request_id) == ("alpha.echo", "sneak-1")
    assert refused.reason.startswith("missing X-Reach-Signature")
    async with token_mesh.http.get(f"{agent.base_url}/healthz") as response:
        assert response.status == 200  # the agent's health stays open to the registry


async def test_forged_tampered_and_stale_signatures_are_refused(token_mesh, make_agent):
    issued = await token_mesh.token("alpha")
    agent, ran = counting_agent(make_agent, "alpha-2", token_mesh, "alpha.echo", registration_token=issued["token"])
    other, _ = counting_agent(make_agent, "alpha-3", token_mesh, "alpha.other", registration_token=issued["token"])
    await agent.start()
    await other.start()
    key = signing_key(issued["token"])
    endpoint = f"{agent.base_url}/atp/alpha.echo"

    async def send(body: bytes, signature: str, request_id: str = "r-1") -> tuple[int, dict[str, Any]]:
        return await post_frame(token_mesh.http, endpoint, body,
                                headers={"X-Request-Id": request_id, SIGNATURE_HEADER: signature})

    body = frame_bytes("alpha.echo", "genuine", "r-1")
    # The positive control: a correct signature made outside the router is accepted, once.
    genuine = sign(key, "alpha-2", "POST", "/atp/alpha.echo", "r-1", body)
    assert (await send(body, genuine))[0] == 200
    assert ran == ["genuine"]
    status, answer = await send(body, genuine)
    assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED") and "replayed" in answer["error_message"]

    tampered = frame_bytes("alpha.echo", "tampered", "r-1")
    cases = {
        "tampered body": (tampered, sign(key, "alpha-2", "POST", "/atp/alpha.echo", "r-1", body), "r-1",
                          "does not match"),
        "wrong key": (body, sign(signing_key("art_forged"), "alpha-2", "POST", "/atp/alpha.echo", "r-1", body), "r-1",
                      "does not match"),
        "stale": (body, sign(key, "alpha-2", "POST", "/atp/alpha.echo", "r-1", body, now=time.time() - 120), "r-1",
                  "stale signature"),
        "another capability's path": (body, sign(key, "alpha-2", "POST", "/atp/alpha.other", "r-1", body), "r-1",
                                      "does not match"),
        "another request id": (body, sign(key, "alpha-2", "POST", "/atp/alpha.echo", "r-1", body), "r-2",
                               "does not match"),
        "malformed": (body, "v2,s=00", "r-1", "malformed"),
    }
    for case, (sent, signature, request_id, reason) in cases.items():
        status, answer = await send(sent, signature, request_id)
        assert (status, answer["error_code"]) == (401, "UNAUTHENTICATED"), case
        assert reason in answer["error_message"], (case, answer)
    assert ran == ["genuine"]


async def test_wrapped_aiohttp_and_fastapi_routes_are_guarded_too(token_mesh, make_agent, teardown):
    issued = await token_mesh.token("wrapped")
    ran: list[str] = []
    port = free_port()
    aio = make_agent("wrapped-aio", token_mesh.registry.url, base_url=f"http://127.0.0.1:{port}",
                     registration_token=issued["token"])
    routes = web.RouteTableDef()

    @register_capability(aio, name="wrapped.aio")
    @routes.post("/internal/aio")
    async def aio_route(request: web.Request) -> web.Response:
        ran.append("aio")
        return web.json_response({"got": await request.json()})

    app = web.Application()
    app.add_routes(routes)
    aio.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    teardown.push_async_callback(runner.cleanup)

    sock = loopback_socket()
    fast_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    fast = make_agent("wrapped-fast", token_mesh.registry.url, registration_token=issued["token"])
    fastapi = FastAPI()

    @register_capability(fast, name="wrapped.fast")
    @fastapi.post("/internal/fast")
    async def fast_route(request: Request) -> dict[str, Any]:
        ran.append("fast")
        return {"got": await request.json()}

    fast.attach(fastapi, base_url=fast_url)
    async with run_uvicorn(fastapi, sock):
        await token_mesh.routable("wrapped-aio")
        await token_mesh.routable("wrapped-fast")
        async with ReachClient(token_mesh.router.url) as client:
            assert await client.call("wrapped.aio", {"q": 1}) == {"got": {"q": 1}}
            assert await client.call("wrapped.fast", {"q": 2}) == {"got": {"q": 2}}
        assert ran == ["aio", "fast"]
        for url in (f"http://127.0.0.1:{port}/internal/aio", f"{fast_url}/internal/fast"):
            async with token_mesh.http.post(url, json={"q": 3}, headers={"X-Request-Id": "sneak-2"}) as response:
                answer = await response.json()
            assert response.status == 401 and answer["error_code"] == "UNAUTHENTICATED", url
            assert answer["request_id"] == "sneak-2"
        assert ran == ["aio", "fast"]


async def test_direct_fallback_is_accepted_only_from_agents_that_declared_it(token_mesh, make_agent, caplog):
    gamma_token = (await token_mesh.token("gamma"))["token"]
    gamma, gamma_ran = counting_agent(make_agent, "gamma-1", token_mesh, "gamma.echo", registration_token=gamma_token,
                                      direct_fallback=True)
    delta, delta_ran = counting_agent(make_agent, "delta-1", token_mesh, "delta.echo",
                                      registration_token=(await token_mesh.token("delta"))["token"])
    await gamma.start()
    await delta.start()
    caplog.set_level(logging.WARNING, logger="agentreach")
    marked = {DIRECT_HEADER: "1", "X-Request-Id": "d-1"}
    status, _ = await post_frame(token_mesh.http, f"{gamma.base_url}/atp/gamma.echo",
                                 frame_bytes("gamma.echo", "direct", "d-1"), headers=marked)
    assert status == 200 and gamma_ran == ["direct"]
    assert [record.request_id for record in caplog.records if record.msg == "direct_call_accepted"] == ["d-1"]
    status, answer = await post_frame(token_mesh.http, f"{delta.base_url}/atp/delta.echo",
                                      frame_bytes("delta.echo", "direct", "d-2"), headers=marked)
    assert status == 401 and "registered without direct_fallback" in answer["error_message"]
    assert delta_ran == []

    # The real fallback: the router is down, the client finds gamma through the registry with a token.
    router_down = refused_url()
    async with ReachClient(router_down, direct_fallback=True, registry_url=token_mesh.registry.url,
                           registry_token=gamma_token) as client:
        assert await client.call("gamma.echo", "fallback") == {"echo": "fallback"}
        assert client.last_route.degraded and client.last_route.instance == "gamma-1"
        with pytest.raises(ReachError) as caught:
            await client.call("delta.echo", "fallback")
        assert caught.value.error_code == "NO_ROUTABLE_INSTANCE"
    assert gamma_ran == ["direct", "fallback"] and delta_ran == []
    async with ReachClient(router_down, direct_fallback=True, registry_url=token_mesh.registry.url) as client:
        with pytest.raises(ReachError) as caught:
            await client.call("gamma.echo", "no token")
        assert caught.value.error_code == "UNAUTHENTICATED" and "registry_token" in str(caught.value)


async def test_verify_calls_off_serves_unsigned_calls(token_mesh, make_agent, caplog):
    caplog.set_level(logging.WARNING, logger="agentreach")
    agent, ran = counting_agent(make_agent, "lax-1", token_mesh, "lax.echo",
                                registration_token=(await token_mesh.token("lax"))["token"], verify_calls=False)
    await agent.start()
    status, _ = await post_frame(token_mesh.http, f"{agent.base_url}/atp/lax.echo", frame_bytes("lax.echo", 1, "l-1"))
    assert status == 200 and ran == [1]
    assert any(record.msg.startswith("verify_calls is off") for record in caplog.records)


async def test_an_agent_without_a_valid_token_cannot_join(token_mesh, make_agent):
    for token in (None, "art_made-up"):
        rogue, _ = counting_agent(make_agent, "rogue-1", token_mesh, "rogue.echo", registration_token=token)
        with pytest.raises(RegistryRejected) as caught:
            await rogue.start()
        assert caught.value.status == 401
    assert "rogue-1" not in token_mesh.registry.registry.state.records


async def test_a_token_opens_the_registry_to_its_own_service_only(token_mesh, make_agent):
    alpha = (await token_mesh.token("alpha"))["token"]
    beta = (await token_mesh.token("beta"))["token"]
    owner, _ = counting_agent(make_agent, "beta-1", token_mesh, "beta.echo", registration_token=beta)
    await owner.start()

    impostor, _ = counting_agent(make_agent, "alpha-as-beta", token_mesh, "alpha.echo", registration_token=alpha,
                                 service="beta")
    with pytest.raises(RegistryRejected) as caught:
        await impostor.start()
    assert caught.value.status == 403 and "for service 'alpha'" in str(caught.value)

    squatter, _ = counting_agent(make_agent, "alpha-squat", token_mesh, "beta.echo", registration_token=alpha)
    with pytest.raises(RegistryRejected) as caught:
        await squatter.start()
    assert caught.value.status == 409 and "owned by service 'beta'" in str(caught.value)

    for path, body, refusal in (
            ("/heartbeat", {"agent_id": "beta-1"}, (403, "forbidden")),
            ("/deregister", {"agent_id": "beta-1"}, (403, "forbidden")),
            ("/register", {"agent_id": "beta-1", "base_url": "http://127.0.0.1:9",
                           "capabilities": [{"name": "alpha.x", "endpoint": "/x"}]}, (409, "agent_id_taken"))):
        status, answer = await token_mesh.registry_post(path, body, alpha)
        assert (status, answer["error"]) == refusal, path
    record = token_mesh.registry.registry.state.records["beta-1"]
    assert record.service == "beta" and record.evicted_at is None


async def test_a_revoked_token_stops_registrations_heartbeats_and_signed_calls(token_mesh, make_agent, caplog):
    issued = await token_mesh.token("omega")
    agent, ran = counting_agent(make_agent, "omega-1", token_mesh, "omega.echo", registration_token=issued["token"])
    await agent.start()
    await token_mesh.routable("omega-1")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("omega.echo", 1) == {"echo": 1}

        caplog.set_level(logging.WARNING, logger="agentreach")
        async with token_mesh.http.post(f"{token_mesh.registry.url}/tokens/{issued['token_id']}/revoke",
                                    headers=token_mesh.admin) as response:
            assert response.status == 200
        late, _ = counting_agent(make_agent, "omega-2", token_mesh, "omega.echo", registration_token=issued["token"])
        with pytest.raises(RegistryRejected) as caught:
            await late.start()
        assert caught.value.status == 401
        await wait_for(lambda: any("refused the heartbeat (HTTP 401)" in str(getattr(record, "error", ""))
                                   for record in caplog.records), what="the running agent's heartbeat refused")

        # The router no longer holds a key for the token, and its instance was evicted with the revocation:
        # nothing is forwarded to it any more (tests/test_hardening_revocation.py).
        await wait_for(lambda: token_mesh.router.mirror.auth.signing_key(issued["token_id"]) is None,
                       what="the router to learn of the revocation")
        with pytest.raises(ReachError) as caught:
            await client.call("omega.echo", 2)
        assert caught.value.error_code == "UNKNOWN_CAPABILITY"
    assert ran == [1] and refusals(caplog) == []
