"""ReachClient: what it sends and how it reads answers (against a recording stand-in), direct
fallback with the router down, and context propagating through a chain of two SDK agents."""

from __future__ import annotations

import asyncio
import logging

import pytest
from agent_reach import (
    ErrorCode,
    ReachClient,
    ReachError,
    RequestFrame,
    ResponseFrame,
    RouteFacts,
    SyncReachClient,
    error_frame,
)

from sdk_support import refused_url, wait_state


async def answer_with(status, frame):
    async def reply(request_frame, request):
        return status, frame(request_frame) if callable(frame) else frame
    return reply


async def test_call_returns_the_result_and_sends_the_contract(stand_in_router):
    route = RouteFacts(instance="a-1", policy="least_load", attempts=1, timeout_sla_ms=5000)
    router = await stand_in_router(await answer_with(
        200, lambda frame: ResponseFrame(request_id=frame.request_id, status="success",
                                         result={"n": frame.payload["n"] + 1}, route=route)))
    async with ReachClient(router.url, api_key="k-123") as client:
        result = await client.call("math.inc", {"n": 41}, context={"session_id": "s-9"}, timeout=2.5)
    assert result == {"n": 42}
    assert client.last_route == route
    [frame] = router.frames
    [headers] = router.headers
    assert frame.capability == "math.inc" and frame.timeout_hint == 2500
    assert frame.context["session_id"] == "s-9" and len(frame.context["trace_id"]) == 32
    assert "parent_request_id" not in frame.context  # a top-level call is a trace's root
    assert headers["X-API-Key"] == "k-123" and headers["X-Request-Id"] == frame.request_id
    assert headers["traceparent"].split("-")[1] == frame.context["trace_id"]


async def test_failed_calls_raise_reach_error_and_send_returns_the_frame(stand_in_router):
    answers = {
        "no.instance": (503, lambda f: error_frame(f.request_id, ErrorCode.NO_ROUTABLE_INSTANCE, "none healthy")),
        "biz.fail": (200, lambda f: ResponseFrame(request_id=f.request_id, status="error",
                                                   business_error={"code": "bad_input", "message": "no"})),
        "not.frame": (502, lambda f: {"oops": True}),
    }

    async def reply(frame, request):
        status, build = answers[frame.capability]
        return status, build(frame)

    router = await stand_in_router(reply)
    async with ReachClient(router.url) as client:
        with pytest.raises(ReachError) as caught:
            await client.call("no.instance", {})
        assert (caught.value.error_code, caught.value.can_retry) == ("NO_ROUTABLE_INSTANCE", True)
        with pytest.raises(ReachError) as caught:
            await client.call("biz.fail", {})
        assert (caught.value.error_code, caught.value.can_retry) == ("BUSINESS_ERROR", False)
        assert caught.value.business_error.code == "bad_input"
        with pytest.raises(ReachError) as caught:
            await client.call("not.frame", {})
        assert caught.value.error_code == "AGENT_ERROR"
        answer = await client.send(RequestFrame(capability="no.instance", request_id="raw-1"))
        assert answer.error_code == "NO_ROUTABLE_INSTANCE" and answer.request_id == "raw-1"


async def test_router_down_without_fallback_is_a_retryable_error():
    async with ReachClient(refused_url()) as client:
        with pytest.raises(ReachError) as caught:
            await client.call("any.thing", {})
    assert (caught.value.error_code, caught.value.can_retry) == ("CONNECT_TIMEOUT", True)


async def test_direct_fallback_reaches_the_agent_through_the_registry(registry, make_agent, http, caplog):
    agent = make_agent("direct-1", registry.url, direct_fallback=True)
    hidden = make_agent("hidden-1", registry.url, service="hidden")

    @agent.capability("direct.echo")
    async def echo(payload, ctx):
        return {"got": payload, "session_id": ctx.session_id}

    @hidden.capability("hidden.echo")
    async def hidden_echo(payload, ctx):
        return payload

    await agent.start()
    await hidden.start()
    await wait_state(http, registry.url, "direct-1", "healthy")
    router_down = refused_url()
    async with ReachClient(router_down, direct_fallback=True, registry_url=registry.url) as client:
        with caplog.at_level(logging.WARNING, logger="agentreach.sdk"):
            result = await client.call("direct.echo", {"a": 1}, context={"session_id": "s-1"})
        assert result == {"got": {"a": 1}, "session_id": "s-1"}
        assert client.last_route.degraded and client.last_route.reason == "direct_fallback"
        assert client.last_route.instance == "direct-1"
        assert any(record.msg.startswith("router unreachable; called an instance directly")
                   for record in caplog.records)

        # An agent that did not opt in is never called directly.
        with pytest.raises(ReachError) as caught:
            await client.call("hidden.echo", 1)
        assert caught.value.error_code == "NO_ROUTABLE_INSTANCE"

        # With the registry down too, the last answer it gave still finds the agent.
        await registry.stop()
        assert (await client.call("direct.echo", 2))["got"] == 2
        with pytest.raises(ReachError) as caught:
            await client.call("never.seen", 1)
        assert caught.value.error_code == "UNKNOWN_CAPABILITY"


async def test_context_propagates_through_a_chain_of_two_agents(registry, make_agent, http):
    planner = make_agent("planner-1", registry.url, direct_fallback=True)
    worker = make_agent("worker-1", registry.url, direct_fallback=True)
    client = ReachClient(refused_url(), direct_fallback=True, registry_url=registry.url)
    seen = {}

    @planner.capability("chain.plan")
    async def plan(payload, ctx):
        ctx.report_tokens(100)
        ctx.update_context(plan="two-steps")
        seen["planner"] = (ctx.request_id, ctx.context)
        done = await client.call("chain.work", {"step": 1})
        return {"worker": done, "budget_left": ctx.token_budget}

    @worker.capability("chain.work")
    async def work(payload, ctx):
        ctx.report_tokens(30)
        seen["worker"] = (ctx.request_id, ctx.context, ctx.remaining())
        return "worked"

    await planner.start()
    await worker.start()
    await wait_state(http, registry.url, "worker-1", "healthy")
    try:
        async with ReachClient(refused_url(), direct_fallback=True,
                               registry_url=registry.url) as caller:
            result = await caller.call("chain.plan", {}, timeout=5,
                                       context={"session_id": "s-7", "user_id": "u-1", "token_budget": 1000})
    finally:
        await client.close()
    planner_id, planner_context = seen["planner"]
    worker_id, worker_context, worker_remaining = seen["worker"]
    assert worker_context["parent_request_id"] == planner_id != worker_id
    assert worker_context["trace_id"] == planner_context["trace_id"]
    assert (worker_context["session_id"], worker_context["user_id"]) == ("s-7", "u-1")
    assert worker_context["token_budget"] == 900 and worker_context["plan"] == "two-steps"
    assert 0 < worker_remaining < 5  # the planner's deadline bounds the nested call
    assert result == {"worker": "worked", "budget_left": 870}
    assert planner.inflight.counters["tokens"] == 100 and worker.inflight.counters["tokens"] == 30


async def test_sync_client_for_scripts(mesh, make_agent):
    agent = make_agent("sync-1", mesh.registry.url)

    @agent.capability("math.double")
    async def double(payload, ctx):
        return payload * 2

    await agent.start()
    await mesh.until_state("sync-1")

    def script():
        with SyncReachClient(mesh.url) as client:
            return client.call("math.double", 21), client.last_route.instance

    assert await asyncio.to_thread(script) == (42, "sync-1")


async def test_direct_fallback_needs_a_registry():
    with pytest.raises(ValueError, match="registry_url"):
        ReachClient("http://127.0.0.1:1", direct_fallback=True)
    with pytest.raises(ValueError, match="go together"):
        ReachClient("http://127.0.0.1:1", client_id="only-half")


async def test_connect_timeout_to_the_router_also_falls_back(registry, make_agent, http, slow_connect):
    agent = make_agent("direct-2", registry.url, direct_fallback=True)

    @agent.capability("direct.ping")
    async def ping(payload, ctx):
        return "pong"

    await agent.start()
    async with ReachClient(slow_connect.url, direct_fallback=True, registry_url=registry.url,
                           connect_timeout=0.2) as client:
        assert await client.call("direct.ping", None) == "pong"
    assert client.last_route.degraded and client.last_route.reason == "direct_fallback"
