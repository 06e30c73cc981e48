"""gRPC agents failing: each of the three timeouts (the handler cancelled), a connect that never completes and
a refused one failed over unsent, a call lost mid-way (a broken exchange: retried only when idempotent), killed
and draining SDK agents with no failed idempotent call, a caller hang-up cancelling the handler, statuses read
by the table, garbage answers, bad registrations, and the registry's gRPC health probe."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import grpc
from agent_reach.grpc_wire import CODE_OF
from grpc_health.v1 import health_pb2

from conftest import post, wait_for
from grpc_support import reply
from registry.cluster import SoleNode
from registry.health import HealthChecker
from router_support import capability
from sdk_support import read_log_until, refused_url, spawn_example
from stream_support import read_stream

RETRY = {"retry": {"enabled": True, "max_attempts": 2}}


def hanging(make_agent, mesh, agent_id: str, name: str, cancelled: list[str], **options: Any):
    """An SDK agent over gRPC whose handler never finishes, noting each call it was made to give up."""
    agent = make_agent(agent_id, mesh.registry.url)

    @agent.capability(name, protocol="grpc", **options)
    async def hang(payload, ctx):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.request_id)
            raise

    return agent


async def test_a_silent_agent_times_out_at_first_byte_and_its_handler_is_cancelled(mesh, make_agent):
    cancelled: list[str] = []
    agent = hanging(make_agent, mesh, "grpc-silent", "grpc.silent", cancelled)
    await agent.start()
    await mesh.until_state("grpc-silent")
    await mesh.put_policy("grpc.silent", {"timeout": {"first_byte_ms": 300, "total_ms": 5000}})
    answer = await mesh.call("grpc.silent", "hello", request_id="silent-1")
    assert (answer.status, answer.body["error_code"]) == (504, "FIRST_BYTE_TIMEOUT")
    await wait_for(lambda: cancelled == ["silent-1"], timeout=2, what="the handler to be cancelled")
    await wait_for(lambda: agent.inflight.count == 0, timeout=2, what="the agent's call to end")


async def test_a_stream_that_stalls_times_out_idle_and_one_that_never_ends_at_its_total(mesh, make_agent, http):
    agent = make_agent("grpc-streams", mesh.registry.url)

    @agent.capability("grpc.stall", protocol="grpc")
    async def stalls(payload, ctx):
        yield "first"
        await asyncio.Event().wait()

    @agent.capability("grpc.endless", protocol="grpc")
    async def endless(payload, ctx):
        for n in range(10_000):
            yield n
            await asyncio.sleep(0.05)

    await agent.start()
    await mesh.until_state("grpc-streams")
    await mesh.put_policy("grpc.stall", {"timeout": {"idle_ms": 300, "total_ms": 20_000}})
    await mesh.put_policy("grpc.endless", {"timeout": {"idle_ms": 5000, "total_ms": 600}})
    stalled = await read_stream(http, f"{mesh.url}/atp", {"capability": "grpc.stall"})
    assert [chunk["data"] for chunk in stalled.chunks] == ["first"]
    assert stalled.final[0] == "error" and stalled.final[1]["error_code"] == "IDLE_TIMEOUT"
    ended = await read_stream(http, f"{mesh.url}/atp", {"capability": "grpc.endless"})
    assert len(ended.chunks) > 1
    assert ended.final[0] == "error" and ended.final[1]["error_code"] == "TOTAL_TIMEOUT"
    await wait_for(lambda: agent.inflight.count == 0, timeout=2, what="both handlers to be cancelled")


async def test_the_total_timeout_is_the_grpc_deadline_the_agent_sees(mesh, make_agent):
    agent = make_agent("grpc-deadline", mesh.registry.url)
    seen: list[float | None] = []

    @agent.capability("grpc.deadline", protocol="grpc")
    async def deadline(payload, ctx):
        seen.append(ctx.remaining())
        await asyncio.Event().wait()

    await agent.start()
    await mesh.until_state("grpc-deadline")
    await mesh.put_policy("grpc.deadline", {"timeout": {"first_byte_ms": 700, "total_ms": 700}})
    answer = await mesh.call("grpc.deadline", 1)
    assert (answer.status, answer.body["error_code"]) == (504, "TOTAL_TIMEOUT")
    assert seen and seen[0] is not None and 0.3 < seen[0] <= 0.7, seen


async def test_a_connect_that_never_completes_and_a_refused_one_fail_over_unsent(mesh, make_agent, slow_connect):
    agent = make_agent("grpc-live", mesh.registry.url, service="grpc.connect")

    @agent.capability("grpc.connect", protocol="grpc")
    async def live(payload, ctx):
        return "from the live one"

    await mesh.register("grpc-hung", [capability("grpc.connect", f"127.0.0.1:{slow_connect.port}", "grpc")])
    refused_port = int(refused_url().rsplit(":", 1)[1].split("/")[0])
    await mesh.register("grpc-refused", [capability("grpc.connect", f"127.0.0.1:{refused_port}", "grpc")],
                        service="grpc.connect")
    await mesh.heartbeat("grpc-hung", "grpc-refused")
    await agent.start()
    for agent_id in ("grpc-hung", "grpc-refused", "grpc-live"):
        await mesh.until_state(agent_id)
    await mesh.put_policy("grpc.connect", {"timeout": {"connect_ms": 200, "total_ms": 5000},
                                           "retry": {"enabled": True, "max_attempts": 3}})
    answers = [await mesh.call("grpc.connect", n) for n in range(8)]
    assert [answer.body["result"] for answer in answers] == ["from the live one"] * 8
    failed: dict[str, set[str]] = {}
    for answer in answers:
        for attempt in (await mesh.get(f"/traces/{answer.body['request_id']}"))["call"]["attempts"][:-1]:
            failed.setdefault(attempt["instance"], set()).add(attempt["error_code"])
    # Unsent either way, so failed over though the capability is not idempotent.
    assert "CONNECT_TIMEOUT" in failed.get("grpc-hung", set()), failed
    assert failed.get("grpc-refused") == {"AGENT_ERROR"}, failed


async def test_a_call_lost_mid_way_is_a_broken_exchange_retried_only_when_idempotent(mesh, grpc_agent):
    async def lost(request, context) -> bytes:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset by peer")

    async def answers(request, context) -> bytes:
        return reply(b'"survivor"')

    dying = await grpc_agent("grpc-dies", lost)
    await mesh.add(dying, "grpc.once")
    await mesh.put_policy("grpc.once", RETRY)
    once = await mesh.call("grpc.once", "x")
    assert (once.status, once.body["error_code"]) == (502, "AGENT_ERROR")
    assert "connection was lost" in once.body["error_message"]
    assert len(dying.calls) == 1  # not idempotent: never sent twice

    await mesh.add(await grpc_agent("grpc-dies-2", lost), "grpc.again", idempotent=True)
    await mesh.add(await grpc_agent("grpc-lives", answers), "grpc.again", idempotent=True)
    await mesh.put_policy("grpc.again", RETRY)
    assert [(await mesh.call("grpc.again", n)).body["result"] for n in range(6)] == ["survivor"] * 6


async def test_statuses_without_an_atp_code_read_by_the_table(mesh, grpc_agent):
    """Another team's gRPC server answers statuses only: each reads as the table says (docs/protocols.md)."""
    for status, code in CODE_OF.items():
        async def refuse(request, context, status=status) -> bytes:
            await context.abort(status, f"refused with {status.name}")

        name = f"grpc.status.{status.name.lower()}"
        await mesh.add(await grpc_agent(f"grpc-{status.name.lower()}", refuse), name)
        await mesh.put_policy(name, {"timeout": {"total_ms": 5000}})
        answer = await mesh.call(name, 1)
        expected = {"UNAUTHENTICATED": "AGENT_ERROR", "FORBIDDEN": "AGENT_ERROR"}.get(code.value, code.value)
        assert answer.body["error_code"] == expected, (status, answer.body)


async def test_garbage_answers_are_the_agents_error_and_fail_over(mesh, grpc_agent):
    async def garbage(request, context) -> bytes:
        return b"\xff\xff\xff not protobuf"

    async def bad_json(request, context) -> bytes:
        return reply(b"{not json")

    async def clean(request, context) -> bytes:
        return reply(b'"clean"')

    broken = [await grpc_agent("grpc-garbage", garbage), await grpc_agent("grpc-bad-json", bad_json)]
    for agent in broken:
        await mesh.add(agent, "grpc.garbage", idempotent=True)
    await mesh.add(await grpc_agent("grpc-clean", clean), "grpc.garbage", idempotent=True)
    await mesh.put_policy("grpc.garbage", {"retry": {"enabled": True, "max_attempts": 3}})
    answers = []
    # Least load breaks ties at random: call until each broken agent has been tried, within a bound.
    while not all(agent.calls for agent in broken) and len(answers) < 60:
        answers.append(await mesh.call("grpc.garbage", len(answers)))
    assert all(agent.calls for agent in broken), [len(agent.calls) for agent in broken]
    assert [answer.body["result"] for answer in answers] == ["clean"] * len(answers)
    errors = set()
    for answer in answers:
        for attempt in (await mesh.get(f"/traces/{answer.body['request_id']}"))["call"]["attempts"][:-1]:
            errors.add((attempt["instance"], attempt["error_code"]))
    assert errors == {("grpc-garbage", "AGENT_ERROR"), ("grpc-bad-json", "AGENT_ERROR")}, errors


async def test_a_caller_leaving_a_grpc_stream_cancels_the_handler(mesh, make_agent, http):
    agent = make_agent("grpc-gone-1", mesh.registry.url)
    cancelled = asyncio.Event()

    @agent.capability("grpc.ticks", protocol="grpc")
    async def ticks(payload, ctx):
        n = 0
        try:
            while True:
                yield n
                n += 1
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await agent.start()
    await mesh.until_state("grpc-gone-1")
    async with http.post(f"{mesh.url}/atp", json={"capability": "grpc.ticks", "payload": None, "stream": True},
                         headers={"Accept": "text/event-stream"}) as response:
        assert response.status == 200
        await response.content.readuntil(b"\n\n")
    await asyncio.wait_for(cancelled.wait(), 5)
    await wait_for(lambda: agent.inflight.count == 0, timeout=2, what="the agent's call to end")


async def test_killed_grpc_agents_lose_no_idempotent_call(mesh):
    processes = [await spawn_example("grpc_agent.py", "--registry", mesh.registry.url, "--port", "0",
                                     "--grpc-port", "0", "--agent-id", f"grpc-kill-{n}",
                                     "--heartbeat-interval", "0.2") for n in (1, 2)]
    try:
        for process, n in zip(processes, (1, 2), strict=True):
            await read_log_until(process, "agent serving gRPC")
            await mesh.until_state(f"grpc-kill-{n}")
        await mesh.put_policy("demo.grpc.echo", RETRY)
        statuses: list[int] = []

        async def caller(worker: int) -> None:
            for n in range(60):
                answer = await mesh.call("demo.grpc.echo", {"text": f"w{worker} n{n}"})
                statuses.append(answer.status)
                if answer.status != 200:
                    raise AssertionError(answer.body)
                if worker == 0 and n == 20:
                    os.kill(processes[0].pid, signal.SIGKILL)

        await asyncio.gather(*(caller(worker) for worker in range(4)))
        assert statuses.count(200) == 240
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


async def test_a_draining_grpc_agent_finishes_its_calls_and_new_ones_go_elsewhere(mesh, make_agent):
    agents = []
    for agent_id in ("grpc-drain-1", "grpc-drain-2"):
        agent = make_agent(agent_id, mesh.registry.url, service="grpc-drain", drain_timeout=10)

        @agent.capability("grpc.drain", protocol="grpc", idempotent=True)
        async def slow(payload, ctx, agent_id=agent_id):
            await asyncio.sleep(payload)
            return agent_id

        await agent.start()
        await mesh.until_state(agent_id)
        agents.append(agent)
    await mesh.put_policy("grpc.drain", RETRY)
    in_flight = [asyncio.create_task(mesh.call("grpc.drain", 0.5)) for _ in range(6)]
    await wait_for(lambda: agents[0].inflight.count > 0, timeout=5, what="calls to reach the first agent")
    stopping = asyncio.create_task(agents[0].stop())
    later = [await mesh.call("grpc.drain", 0) for _ in range(6)]
    await stopping
    assert [answer.status for answer in await asyncio.gather(*in_flight)] == [200] * 6
    assert [(answer.status, answer.body["result"]) for answer in later] == [(200, "grpc-drain-2")] * 6


async def test_grpc_registrations_that_are_not_host_port_are_refused_naming_the_field(mesh, http):
    for endpoint in ("http://127.0.0.1:9/x", "127.0.0.1", "127.0.0.1:99999", "/relative", "host:1/path",
                     "a b:1", "127.0.0.1:1\r\nX: y"):
        body = {"agent_id": "grpc-bad", "capabilities": [{"name": "x", "endpoint": endpoint, "protocol": "grpc"}]}
        async with http.post(f"{mesh.registry.url}/register", json=body) as response:
            refused = await response.json()
        assert response.status == 400, (endpoint, refused)
        assert (refused["error"], refused["field"]) == ("invalid_endpoint", "capabilities[0].endpoint"), refused
    body = {"agent_id": "grpc-guarded", "capabilities": [{"name": "x", "endpoint": "169.254.169.254:80",
                                                          "protocol": "grpc"}]}
    async with http.post(f"{mesh.registry.url}/register", json=body) as response:
        refused = await response.json()
    assert (response.status, refused["field"]) == (400, "capabilities[0].endpoint"), refused
    assert "grpc-bad" not in mesh.registry.registry.state.liveness


async def test_the_registry_probes_a_grpc_instance_with_the_standard_health_service(start_registry, grpc_agent,
                                                                                        http):
    registry = await start_registry(health_interval=3600, silence_timeout=30)

    async def unused(request, context) -> bytes:
        raise AssertionError("a probe is no call")

    serving = await grpc_agent("grpc-probed", unused)
    body = {"agent_id": "grpc-probed", "service": "grpc-probed",
            "capabilities": [{"name": "grpc.probed", "endpoint": serving.endpoint, "protocol": "grpc"}]}
    assert (await post(http, f"{registry.url}/register", body))[0] == 200
    assert registry.registry.agent("grpc-probed").health_url == f"grpc://{serving.endpoint}"
    checker = HealthChecker(registry.registry, http, SoleNode(registry.registry, None, url=""))
    results = [await checker._probe(f"grpc://{serving.endpoint}")]
    await serving.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    results.append(await checker._probe(f"grpc://{serving.endpoint}"))
    await serving.stop()
    results.append(await checker._probe(f"grpc://{serving.endpoint}"))
    assert results == [True, False, False]
