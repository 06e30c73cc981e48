"""Existing FastAPI and aiohttp services joining the mesh: the right endpoint registered, behaviour unchanged."""

from __future__ import annotations

import importlib.util
import json

import pytest
from agent_reach import AgentReachSDK, ReachClient, ReachError, atp_handler, current, register_capability
from agent_reach.serving import listen
from aiohttp import web
from fastapi import FastAPI

from sdk_support import EXAMPLES, agent_view, free_port, loopback_socket, refused_url, run_uvicorn, wait_state


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_fastapi_seed_example_registers_its_route_and_behaves_as_before(registry, http, monkeypatch):
    sock = loopback_socket()
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("AGENTREACH_REGISTRY", registry.url)
    monkeypatch.setenv("INTENT_BASE_URL", base_url)
    before, after = load_example("intent_fastapi_before"), load_example("intent_fastapi_after")
    [route] = [route for route in after.app.routes if getattr(route, "path", None) == "/internal/intent"]
    assert route.endpoint is after.detect_intent and not hasattr(after.detect_intent, "__wrapped__")
    after.reach_sdk.heartbeat_interval = 0.2

    async with run_uvicorn(after.app, sock):
        view = await wait_state(http, registry.url, "intent-agent-prod-01", "healthy")
        [capability] = view["capabilities"]
        assert capability == {**capability, "name": "intent.detect", "protocol": "rest", "version": "3.2",
                              "endpoint": f"{base_url}/internal/intent"}
        assert view["metadata"]["zone"] == "cn-east-1" and view["health_url"] == f"{base_url}/healthz"
        async with http.get(f"{base_url}/healthz") as response:
            assert response.status == 200

        body = {"text": "I need a refund please", "session_id": "s-1"}
        async with http.post(capability["endpoint"], json=body) as response:
            assert response.status == 200
            answer = await response.json()
        async with http.post(capability["endpoint"], json={"text": 3}) as response:
            invalid_status = response.status
        assert after.reach_sdk.inflight.counters["calls"] == 2
    # The "before" service, called directly in-process, gives the same answer.
    expected = await before.detect_intent(before.IntentRequest(**body))
    assert answer == expected.model_dump() == {"intent": "refund.request", "confidence": 0.9}
    assert invalid_status == 422
    assert await agent_view(http, registry.url, "intent-agent-prod-01") is None  # deregistered at shutdown


async def test_fastapi_route_sees_the_router_context(registry, make_agent, http):
    sock = loopback_socket()
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = FastAPI()
    sdk = make_agent("ctx-fastapi-1", registry.url, base_url=base_url)
    sdk.attach(app)

    @register_capability(sdk, name="ctx.show", protocol="rest")
    @app.post("/ctx")
    async def show(body: dict):
        call = current()
        return {"request_id": call.request_id, "context": call.context, "body": body}

    async with run_uvicorn(app, sock):
        await wait_state(http, registry.url, "ctx-fastapi-1", "healthy")
        headers = {"X-Request-Id": "rest-1", "X-Reach-Context": json.dumps({"session_id": "s-2"}),
                   "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
        async with http.post(f"{base_url}/ctx", json={"k": 1}, headers=headers) as response:
            answer = await response.json()
    assert answer == {"request_id": "rest-1", "body": {"k": 1},
                      "context": {"session_id": "s-2", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}}


async def test_aiohttp_route_registers_unchanged_next_to_native_capabilities(registry, make_agent, http):
    # aiohttp learns its port only once listening, so the base URL is fixed up front here.
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    routes = web.RouteTableDef()
    sdk = make_agent("aio-1", registry.url, base_url=base_url, direct_fallback=True)

    async def add(request: web.Request) -> web.Response:
        body = await request.json()
        if "a" not in body:
            return web.json_response({"business_error": {"code": "missing_a", "message": "a is required"}})
        return web.json_response({"sum": body["a"] + body["b"]})

    wrapped = register_capability(sdk, name="math.add", protocol="rest", version="1.1",
                                  timeout_sla_ms=2000)(routes.post("/internal/add")(add))
    assert wrapped is add

    @sdk.capability("math.neg")
    async def neg(payload, ctx):
        return -payload

    app = web.Application()
    app.add_routes(routes)
    sdk.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    try:
        view = await wait_state(http, registry.url, "aio-1", "healthy")
        endpoints = {c["name"]: (c["protocol"], c["endpoint"]) for c in view["capabilities"]}
        assert endpoints == {"math.add": ("rest", f"{base_url}/internal/add"),
                             "math.neg": ("atp", f"{base_url}/atp/math.neg")}
        async with http.post(f"{base_url}/internal/add", json={"a": 2, "b": 3}) as response:
            assert (response.status, await response.json()) == (200, {"sum": 5})
        assert sdk.inflight.counters["calls"] == 1

        # Direct fallback speaks each capability's protocol: rest for the route, atp for the native one.
        async with ReachClient(refused_url(), direct_fallback=True,
                               registry_url=registry.url) as client:
            assert await client.call("math.add", {"a": 40, "b": 2}) == {"sum": 42}
            assert await client.call("math.neg", 5) == -5
            with pytest.raises(ReachError) as caught:
                await client.call("math.add", {"b": 1})
        assert caught.value.error_code == "BUSINESS_ERROR" and caught.value.business_error.code == "missing_a"
    finally:
        await runner.cleanup()
    assert await agent_view(http, registry.url, "aio-1") is None  # on_shutdown deregistered


async def test_a_route_that_cannot_be_found_fails_at_start(registry, make_agent):
    sdk = make_agent("lost-1", registry.url, base_url="http://127.0.0.1:9")

    @register_capability(sdk, name="lost.route")
    async def not_routed(request):
        return None

    sdk.attach(web.Application())
    with pytest.raises(LookupError, match=r"lost\.route"):
        await sdk.start()


async def test_explicit_path_for_a_service_the_sdk_does_not_run(registry, make_agent, http):
    sdk = make_agent("ext-1", registry.url)

    @register_capability(sdk, name="ext.thing", path="/v1/thing")
    async def thing(request):
        return None

    sdk.attach("http://127.0.0.1:9999")
    await sdk.start()
    view = await wait_state(http, registry.url, "ext-1", "healthy")
    assert view["capabilities"][0]["endpoint"] == "http://127.0.0.1:9999/v1/thing"
    assert view["health_url"] == "http://127.0.0.1:9999/healthz"


def test_declarations_fail_fast():
    sdk = AgentReachSDK(agent_id="decl-1", registry_url="http://127.0.0.1:9", zone="z")
    with pytest.raises(TypeError):
        sdk.capability("sync.handler")(lambda payload, ctx: None)
    with pytest.raises(Exception, match="name"):
        sdk.capability("bad name!")
    sdk.capability("one.cap")(_async_noop)
    with pytest.raises(ValueError, match="twice"):
        register_capability(sdk, name="one.cap")(_async_noop)
    assert atp_handler(sdk, name="two.cap", version="2.0")(_async_noop) is _async_noop
    declared = {c.name: (c.protocol, c.version, c.endpoint) for c in sdk.registration().capabilities}
    assert declared == {"one.cap": ("atp", "1.0", "/atp/one.cap"), "two.cap": ("atp", "2.0", "/atp/two.cap")}


async def _async_noop(payload, ctx):
    return None
