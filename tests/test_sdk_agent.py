"""An SDK agent against a real registry, called on its ATP endpoint exactly as the router calls it."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from agent_reach import BusinessFailure, ResponseFrame
from agent_reach.usage import Usage

from conftest import wait_for
from sdk_support import agent_view, free_port, post_frame, wait_state


def echo_agent(make_agent, registry_url, agent_id="echo-1", **options):
    agent = make_agent(agent_id, registry_url, **options)

    @agent.capability("test.echo", version="2.0", description="echo", examples=['{"x": 1}'], timeout_sla_ms=5000)
    async def echo(payload, ctx):
        ctx.report_tokens(7)
        ctx.update_context(seen_by=agent_id)
        return {"payload": payload, "request_id": ctx.request_id, "context": ctx.context}

    return agent


async def test_registers_turns_healthy_and_serves_frames(registry, make_agent, http):
    agent = echo_agent(make_agent, registry.url, metadata={"model": "m1", "max_qps": 5})
    await agent.start()
    view = await wait_state(http, registry.url, "echo-1", "healthy")
    [capability] = view["capabilities"]
    assert capability["endpoint"] == f"{agent.base_url}/atp/test.echo"
    assert (capability["protocol"], capability["version"], capability["timeout_sla_ms"]) == ("atp", "2.0", 5000)
    assert view["metadata"] == {"zone": "test", "model": "m1", "max_qps": 5}
    assert view["health_url"] == f"{agent.base_url}/healthz"

    frame = {"request_id": "r-1", "capability": "test.echo", "payload": {"x": 1},
             "context": {"session_id": "s-1"}, "timeout_hint": 2000}
    trace = "0af7651916cd43dd8448eb211c80319c"
    status, answer = await post_frame(http, capability["endpoint"], frame, {
        "X-Request-Id": "r-1", "traceparent": f"00-{trace}-b7ad6b7169203331-01",
        "X-Reach-Completion-Url": "http://127.0.0.1:9/unused"})
    assert status == 200
    assert msgspec.convert(answer, ResponseFrame) == ResponseFrame(
        request_id="r-1", status="success",
        result={"payload": {"x": 1}, "request_id": "r-1", "context": {"session_id": "s-1", "trace_id": trace}},
        context_update={"seen_by": "echo-1", "tokens_used": 7}, usage=Usage(output_tokens=7))

    async with http.get(f"{agent.base_url}/healthz") as response:
        assert response.status == 200
    # Counters and load reach the registry with the next heartbeats.
    view = await wait_for(lambda: _metrics_show_call(http, registry.url), what="call counted in heartbeat")
    assert view["metrics"]["tokens"] == 7 and view["inflight"] == 0 and view["load"] == 0.0


async def _metrics_show_call(http, registry_url):
    view = await agent_view(http, registry_url, "echo-1")
    return view if (view["metrics"] or {}).get("calls") == 1 else None


async def test_failures_become_frames_and_never_leave_the_caller_hanging(registry, make_agent, http):
    agent = make_agent("frames-1", registry.url, max_inflight=2)
    cancelled = asyncio.Event()
    called = []

    @agent.capability("test.boom")
    async def boom(payload, ctx):
        raise RuntimeError("model exploded")

    @agent.capability("test.refuse")
    async def refuse(payload, ctx):
        raise BusinessFailure("low_confidence", "cannot tell", details={"score": 0.1})

    @agent.capability("test.slow", timeout_sla_ms=300)
    async def slow(payload, ctx):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @agent.capability("test.small", max_payload_bytes=100)
    async def small(payload, ctx):
        called.append(payload)
        return "ok"

    @agent.capability("test.weird")
    async def weird(payload, ctx):
        return object()

    await agent.start()
    base = f"{agent.base_url}/atp"

    status, answer = await post_frame(http, f"{base}/test.boom", {"request_id": "b1", "payload": 1})
    assert status == 502 and answer["error_code"] == "AGENT_ERROR" and answer["can_retry"] is True
    assert "model exploded" in answer["error_message"] and answer["request_id"] == "b1"

    status, answer = await post_frame(http, f"{base}/test.refuse", {"request_id": "b2", "payload": 1})
    assert status == 200 and answer["status"] == "error"
    assert answer["business_error"] == {"code": "low_confidence", "message": "cannot tell", "details": {"score": 0.1}}

    # The frame's timeout_hint wins over the declared SLA; the handler is cancelled at the deadline.
    started = time.monotonic()
    status, answer = await post_frame(http, f"{base}/test.slow", {"request_id": "b3", "payload": 1,
                                                                  "timeout_hint": 200})
    # The handler sleeps 30 s: a deadline that was not kept would take that long, far past this bound.
    assert status == 504 and answer["error_code"] == "TOTAL_TIMEOUT" and time.monotonic() - started < 10
    await asyncio.wait_for(cancelled.wait(), 2)
    cancelled.clear()
    status, answer = await post_frame(http, f"{base}/test.slow", {"request_id": "b4", "payload": 1})
    assert status == 504 and answer["error_code"] == "TOTAL_TIMEOUT"  # no hint: the 300 ms SLA

    status, answer = await post_frame(http, f"{base}/test.small", {"request_id": "b5", "payload": "x" * 500})
    assert status == 413 and answer["error_code"] == "PAYLOAD_TOO_LARGE" and called == []
    status, answer = await post_frame(http, f"{base}/test.small", b"x" * 2_000_000, {"X-Request-Id": "b6"})
    assert status == 413 and answer == {**answer, "request_id": "b6", "error_code": "PAYLOAD_TOO_LARGE"}
    status, answer = await post_frame(http, f"{base}/test.small", {"request_id": "b7", "payload": "fits"})
    assert status == 200 and answer["result"] == "ok"

    for bad in (b"{not json", b'{"payload": 1, "timeout_hint": "soon"}', b'{"capability": "test.boom"}'):
        status, answer = await post_frame(http, f"{base}/test.small", bad)
        assert status == 400 and answer["error_code"] == "INVALID_FRAME", bad
    status, answer = await post_frame(http, f"{base}/nope", {"payload": 1})
    assert status == 404 and answer["error_code"] == "UNKNOWN_CAPABILITY"
    status, answer = await post_frame(http, f"{base}/test.weird", {"payload": 1})
    assert status == 502 and answer["error_code"] == "AGENT_ERROR"

    # At max_inflight, a new call is answered busy at once.
    slow_calls = [asyncio.create_task(post_frame(http, f"{base}/test.slow", {"payload": i, "timeout_hint": 600}))
                  for i in range(2)]
    await wait_for(lambda: agent.inflight.count == 2, what="two calls in flight")
    status, answer = await post_frame(http, f"{base}/test.small", {"payload": "x"})
    assert status == 429 and answer["error_code"] == "BUSY" and answer["can_retry"] is True
    assert [status for status, _ in await asyncio.gather(*slow_calls)] == [504, 504]
    counters = agent.inflight.counters
    assert (counters["errors"], counters["business_errors"], counters["timeouts"]) == (7, 1, 4)


async def test_late_completion_is_reported_to_the_router(registry, make_agent, http, stand_in_router):
    router = await stand_in_router(lambda frame, request: None)
    agent = make_agent("late-1", registry.url)

    @agent.capability("test.blocking")
    async def blocking(payload, ctx):
        time.sleep(0.4)  # holds the loop, so the deadline timer cannot fire before the handler ends
        return "done"

    await agent.start()
    status, answer = await post_frame(http, f"{agent.base_url}/atp/test.blocking",
                                      {"request_id": "late-r", "payload": 1, "timeout_hint": 100},
                                      {"X-Reach-Completion-Url": f"{router.url}/completions"})
    assert status == 200 and answer["result"] == "done"
    [notice] = await wait_for(lambda: router.completions, what="late-completion notice")
    assert notice["request_id"] == "late-r" and notice["agent_id"] == "late-1"
    assert 400 <= notice["finished_ms"] < 5000


async def test_heartbeats_keep_flowing_during_a_long_call(registry, make_agent, http):
    agent = make_agent("long-1", registry.url, heartbeat_interval=0.2, max_inflight=4)

    @agent.capability("test.long")
    async def long_call(payload, ctx):
        await asyncio.sleep(payload)
        return "finished"

    await agent.start()
    await wait_state(http, registry.url, "long-1", "healthy")
    beats_before = agent.link.beats
    call = asyncio.create_task(post_frame(http, f"{agent.base_url}/atp/test.long", {"payload": 3.0}))
    ages = []
    while not call.done():
        view = await agent_view(http, registry.url, "long-1")
        if view["inflight"] == 1:
            assert view["load"] == 0.25 and view["state"] == "healthy"
            ages.append(view["last_heartbeat_ms_ago"])
        await asyncio.sleep(0.1)
    status, answer = await call
    assert status == 200 and answer["result"] == "finished"
    assert len(ages) >= 20 and max(ages) < 1000
    assert agent.link.beats - beats_before >= 10


async def test_a_handler_blocking_the_loop_is_warned_about(registry, make_agent, http, caplog):
    agent = make_agent("blocky-1", registry.url)

    @agent.capability("test.sync_io")
    async def sync_io(payload, ctx):
        time.sleep(0.5)
        return "ok"

    await agent.start()
    with caplog.at_level(logging.WARNING, logger="agentreach.sdk"):
        status, _ = await post_frame(http, f"{agent.base_url}/atp/test.sync_io", {"payload": 1})
        assert status == 200
        warning = await wait_for(lambda: next((r for r in caplog.records if r.msg.startswith("event loop blocked")),
                                              None), what="blocked-loop warning")
    assert warning.lag_ms >= 300


async def test_survives_registry_restarts(registry_at, make_agent, http, tmp_path, caplog):
    port = free_port()
    first = await registry_at(port, tmp_path / "first")
    agent = echo_agent(make_agent, first.url, agent_id="restart-1")
    await agent.start()
    await wait_state(http, first.url, "restart-1", "healthy")

    # Same data dir: the registry replays the instance and heartbeats simply resume.
    await first.stop()
    status, answer = await post_frame(http, f"{agent.base_url}/atp/test.echo", {"payload": "still serving"})
    assert status == 200 and answer["result"]["payload"] == "still serving"
    again = await registry_at(port, tmp_path / "first")
    await wait_state(http, again.url, "restart-1", "healthy")
    assert not [r for r in caplog.records if r.msg.startswith("registry does not know this instance")]

    # Fresh data dir: heartbeats get 404 unknown_agent, and the SDK registers again.
    await again.stop()
    fresh = await registry_at(port, tmp_path / "fresh")
    view = await wait_state(http, fresh.url, "restart-1", "healthy")
    assert view["capabilities"][0]["endpoint"] == f"{agent.base_url}/atp/test.echo"
    assert [r for r in caplog.records if r.msg.startswith("registry does not know this instance")]


async def test_starts_while_the_registry_is_down_and_registers_later(registry_at, make_agent, http, tmp_path):
    port = free_port()
    agent = echo_agent(make_agent, f"http://127.0.0.1:{port}", agent_id="early-1")
    await agent.start()
    status, _ = await post_frame(http, f"{agent.base_url}/atp/test.echo", {"payload": 1})
    assert status == 200
    registry = await registry_at(port, tmp_path / "late")
    await wait_state(http, registry.url, "early-1", "healthy")


async def test_stop_deregisters_refuses_new_calls_and_drains(registry, make_agent, http):
    agent = make_agent("drain-1", registry.url)
    release = asyncio.Event()

    @agent.capability("test.wait")
    async def wait(payload, ctx):
        await release.wait()
        return "drained"

    await agent.start()
    await wait_state(http, registry.url, "drain-1", "healthy")
    in_flight = asyncio.create_task(post_frame(http, f"{agent.base_url}/atp/test.wait", {"payload": 1}))
    await wait_for(lambda: agent.inflight.count == 1, what="call in flight")
    stopping = asyncio.create_task(agent.stop())
    await wait_for(lambda: _gone(http, registry.url, "drain-1"), what="deregistered")
    status, answer = await post_frame(http, f"{agent.base_url}/atp/test.wait", {"payload": 2})
    assert status == 429 and answer["error_code"] == "BUSY"
    assert not stopping.done()
    release.set()
    status, answer = await in_flight
    assert status == 200 and answer["result"] == "drained"
    await asyncio.wait_for(stopping, 5)


async def test_drain_deadline_abandons_calls_with_an_answer(registry, make_agent, http):
    agent = make_agent("drain-2", registry.url, drain_timeout=0.3)

    @agent.capability("test.forever")
    async def forever(payload, ctx):
        await asyncio.sleep(60)

    await agent.start()
    in_flight = asyncio.create_task(post_frame(http, f"{agent.base_url}/atp/test.forever", {"payload": 1}))
    await wait_for(lambda: agent.inflight.count == 1, what="call in flight")
    await asyncio.wait_for(agent.stop(), 5)
    status, answer = await in_flight
    assert status == 429 and answer["error_code"] == "BUSY"


async def _gone(http, registry_url, agent_id):
    return await agent_view(http, registry_url, agent_id) is None
