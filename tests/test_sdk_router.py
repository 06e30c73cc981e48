"""SDK agents and ReachClient with the real router in between (registry + router from router_support)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from agent_reach import BusinessFailure, ReachClient, ReachError, current, register_capability
from agent_reach.serving import listen
from aiohttp import web

from conftest import wait_for
from sdk_support import free_port


async def test_calls_through_the_router_reach_an_sdk_agent(mesh, make_agent):
    agent = make_agent("routed-1", mesh.registry.url)
    seen = {}

    @agent.capability("routed.upper", timeout_sla_ms=2000)
    async def upper(payload, ctx):
        seen["context"] = ctx.context
        if payload == "refuse":
            raise BusinessFailure("refused", "not this one")
        if payload == "crash":
            raise ValueError("boom")
        if payload == "hang":
            await asyncio.sleep(30)
        return payload.upper()

    await agent.start()
    await mesh.until_state("routed-1")
    async with ReachClient(mesh.url) as client:
        assert await client.call("routed.upper", "mesh", context={"session_id": "s-1"}) == "MESH"
        route = client.last_route
        assert (route.instance, route.degraded, route.timeout_sla_ms) == ("routed-1", False, 2000)
        trace_id = seen["context"]["trace_id"]
        assert seen["context"]["session_id"] == "s-1" and len(trace_id) == 32

        with pytest.raises(ReachError) as caught:
            await client.call("routed.upper", "refuse")
        assert caught.value.error_code == "BUSINESS_ERROR" and caught.value.business_error.code == "refused"
        with pytest.raises(ReachError) as caught:
            await client.call("routed.upper", "crash")
        assert caught.value.error_code == "AGENT_ERROR"
        with pytest.raises(ReachError) as caught:
            await client.call("routed.upper", "hang", timeout=0.3)
        # The agent's deadline and the router's coincide; whichever fires first answers.
        assert caught.value.error_code in ("TOTAL_TIMEOUT", "FIRST_BYTE_TIMEOUT") and caught.value.can_retry


async def test_a_result_the_router_gave_up_on_is_reported_as_late(mesh, make_agent, caplog):
    agent = make_agent("late-routed-1", mesh.registry.url)

    @agent.capability("routed.slow", timeout_sla_ms=5000)
    async def slow(payload, ctx):
        await asyncio.sleep(0.6)
        return "finally"

    await agent.start()
    await mesh.until_state("late-routed-1")
    await mesh.put_policy("routed.slow", {"timeout": {"connect_ms": 100, "first_byte_ms": 200, "total_ms": 5000}})
    async with ReachClient(mesh.url) as client:
        with caplog.at_level(logging.WARNING, logger="agentreach"):
            with pytest.raises(ReachError) as caught:
                await client.call("routed.slow", None)
            assert caught.value.error_code == "FIRST_BYTE_TIMEOUT"
            line = await wait_for(lambda: next((r for r in caplog.records
                                                if r.msg == "execution_success_but_response_timeout"), None),
                                  what="the router to log the late completion")
    assert line.reporter == "late-routed-1" and 600 <= line.finished_ms < 5000


async def test_a_wrapped_route_gets_the_routers_context_and_deadline(mesh, make_agent, teardown):
    port = free_port()
    sdk = make_agent("wrapped-routed-1", mesh.registry.url, base_url=f"http://127.0.0.1:{port}")
    routes = web.RouteTableDef()

    @register_capability(sdk, name="routed.rest", timeout_sla_ms=3000)
    @routes.post("/internal/rest")
    async def rest(request: web.Request) -> web.Response:
        call = current()
        return web.json_response({"body": await request.json(), "session_id": call.session_id,
                                  "remaining_s": call.remaining()})

    app = web.Application()
    app.add_routes(routes)
    sdk.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    teardown.push_async_callback(runner.cleanup)
    await mesh.until_state("wrapped-routed-1")
    async with ReachClient(mesh.url) as client:
        result = await client.call("routed.rest", {"q": 1}, context={"session_id": "s-rest"}, timeout=2)
    assert result["body"] == {"q": 1} and result["session_id"] == "s-rest"
    assert 0 < result["remaining_s"] <= 2


async def test_context_chain_through_the_router(mesh, make_agent):
    planner = make_agent("chain-planner", mesh.registry.url)
    worker = make_agent("chain-worker", mesh.registry.url)
    seen = {}

    @planner.capability("chain.plan")
    async def plan(payload, ctx):
        seen["planner"] = ctx.request_id, ctx.trace_id
        async with ReachClient(mesh.url) as client:
            return await client.call("chain.work", None)

    @worker.capability("chain.work")
    async def work(payload, ctx):
        seen["worker"] = ctx.parent_request_id, ctx.trace_id, ctx.user_id
        return "done"

    await planner.start()
    await worker.start()
    await mesh.until_state("chain-planner")
    await mesh.until_state("chain-worker")
    async with ReachClient(mesh.url) as client:
        assert await client.call("chain.plan", None, context={"user_id": "u-9"}) == "done"
    planner_request, trace_id = seen["planner"]
    assert seen["worker"] == (planner_request, trace_id, "u-9")
