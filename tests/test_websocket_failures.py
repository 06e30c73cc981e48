"""WebSocket agents failing: each of the three timeouts (the agent told to cancel), an unanswered connect
failed over, a connection lost mid-call (a broken exchange: retried only when idempotent), killed and draining
SDK agents with no failed idempotent call, and peers sending what the protocol does not allow."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
from agent_reach.socket_wire import Envelope, encode

from conftest import wait_for
from router.core import RouterSettings
from router_support import capability
from sdk_support import read_log_until, spawn_example
from stream_support import read_stream

RETRY = {"retry": {"enabled": True, "max_attempts": 2}}


async def silent(call) -> None:
    await asyncio.Event().wait()


async def test_a_silent_agent_times_out_at_first_byte_and_is_told_to_cancel(mesh, socket_agent):
    agent = await socket_agent("ws-silent", silent)
    await mesh.add(agent, "ws.silent")
    await mesh.put_policy("ws.silent", {"timeout": {"first_byte_ms": 300, "total_ms": 5000}})
    answer = await mesh.call("ws.silent", "hello", request_id="silent-1")
    assert (answer.status, answer.body["error_code"]) == (504, "FIRST_BYTE_TIMEOUT")
    await wait_for(lambda: agent.cancels == ["silent-1"], timeout=2, what="the agent to be told to cancel")


async def test_a_stream_that_stalls_times_out_idle_and_one_that_never_ends_at_its_total(mesh, socket_agent, http):
    async def stalls(call) -> None:
        await call.chunk(0, "first")
        await asyncio.Event().wait()

    async def endless(call) -> None:
        for seq in range(10_000):
            await call.chunk(seq, seq)
            await asyncio.sleep(0.05)

    await mesh.add(await socket_agent("ws-stall", stalls), "ws.stall")
    await mesh.add(await socket_agent("ws-endless", endless), "ws.endless")
    await mesh.put_policy("ws.stall", {"timeout": {"idle_ms": 300, "total_ms": 20_000}})
    await mesh.put_policy("ws.endless", {"timeout": {"idle_ms": 5000, "total_ms": 600}})
    stalled = await read_stream(http, f"{mesh.url}/atp", {"capability": "ws.stall"})
    assert [chunk["data"] for chunk in stalled.chunks] == ["first"]
    assert stalled.final[0] == "error" and stalled.final[1]["error_code"] == "IDLE_TIMEOUT"
    ended = await read_stream(http, f"{mesh.url}/atp", {"capability": "ws.endless"})
    assert len(ended.chunks) > 1
    assert ended.final[0] == "error" and ended.final[1]["error_code"] == "TOTAL_TIMEOUT"


async def test_a_connect_that_never_completes_times_out_and_the_call_fails_over(mesh, socket_agent, slow_connect):
    async def answers(call) -> None:
        await call.reply("from the live one")

    await mesh.register("ws-hung", [capability("ws.connect", slow_connect.endpoint, "websocket")])
    await mesh.heartbeat("ws-hung")
    await mesh.until_state("ws-hung")
    await mesh.add(await socket_agent("ws-live", answers), "ws.connect")
    await mesh.put_policy("ws.connect", {"timeout": {"connect_ms": 200, "total_ms": 5000}})
    # Idle instances are tried in random order: call until one call met the hung instance first (each does
    # with even odds; six calls missed it one run in 64, thirty miss it one in a billion).
    answers_seen = []
    for n in range(30):
        answers_seen.append(await mesh.call("ws.connect", n))
        if answers_seen[-1].body["route"]["attempts"] == 2:
            break
    assert [answer.body["result"] for answer in answers_seen] == ["from the live one"] * len(answers_seen)
    trace = [answer for answer in answers_seen if answer.body["route"]["attempts"] == 2]
    assert trace, "no call tried the hung instance first"
    first = (await mesh.get(f"/traces/{trace[0].body['request_id']}"))["call"]["attempts"][0]
    assert (first["instance"], first["error_code"]) == ("ws-hung", "CONNECT_TIMEOUT"), first


async def test_a_connection_lost_mid_call_is_a_broken_exchange_retried_only_when_idempotent(mesh, socket_agent):
    async def dies(call) -> None:
        await call.socket.close()

    async def answers(call) -> None:
        await call.reply("survivor")

    dying = await socket_agent("ws-dies", dies)
    await mesh.add(dying, "ws.once")
    await mesh.put_policy("ws.once", RETRY)
    once = await mesh.call("ws.once", "x", request_id="once-1")
    assert (once.status, once.body["error_code"]) == (502, "AGENT_ERROR")
    assert "connection was lost" in once.body["error_message"]
    assert len(dying.calls) == 1

    await mesh.add(await socket_agent("ws-dies-2", dies), "ws.again", idempotent=True)
    await mesh.add(await socket_agent("ws-lives", answers), "ws.again", idempotent=True)
    await mesh.put_policy("ws.again", RETRY)
    answers_seen = [await mesh.call("ws.again", n) for n in range(6)]
    assert [answer.body["result"] for answer in answers_seen] == ["survivor"] * 6


async def test_killed_websocket_agents_lose_no_idempotent_call(mesh, http):
    processes = [await spawn_example("websocket_agent.py", "--registry", mesh.registry.url, "--port", "0",
                                     "--agent-id", f"ws-kill-{n}", "--heartbeat-interval", "0.2") for n in (1, 2)]
    try:
        for process, n in zip(processes, (1, 2), strict=True):
            await read_log_until(process, "agent listening")
            await mesh.until_state(f"ws-kill-{n}")
        await mesh.put_policy("demo.ws.echo", RETRY)
        results: list[aiohttp.ClientResponse | int] = []

        async def caller(worker: int) -> None:
            for n in range(60):
                answer = await mesh.call("demo.ws.echo", {"text": f"w{worker} n{n}"})
                results.append(answer.status)
                if answer.status != 200:
                    raise AssertionError(answer.body)
                if worker == 0 and n == 20:
                    os.kill(processes[0].pid, signal.SIGKILL)

        await asyncio.gather(*(caller(worker) for worker in range(4)))
        assert results.count(200) == 240
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


async def test_a_draining_websocket_agent_finishes_its_calls_and_new_ones_go_elsewhere(mesh, make_agent):
    agents = []
    for agent_id in ("ws-drain-1", "ws-drain-2"):
        agent = make_agent(agent_id, mesh.registry.url, service="ws-drain", drain_timeout=10)

        @agent.capability("ws.drain", protocol="websocket", idempotent=True)
        async def slow(payload, ctx, agent_id=agent_id):
            await asyncio.sleep(payload)
            return agent_id

        await agent.start()
        await mesh.until_state(agent_id)
        agents.append(agent)
    await mesh.put_policy("ws.drain", RETRY)
    in_flight = [asyncio.create_task(mesh.call("ws.drain", 0.5)) for _ in range(6)]
    await wait_for(lambda: agents[0].inflight.count > 0, timeout=5, what="calls to reach the first agent")
    stopping = asyncio.create_task(agents[0].stop())
    later = [await mesh.call("ws.drain", 0) for _ in range(6)]
    await stopping
    assert [answer.status for answer in await asyncio.gather(*in_flight)] == [200] * 6
    assert [(answer.status, answer.body["result"]) for answer in later] == [(200, "ws-drain-2")] * 6


async def test_an_agent_sending_garbage_or_answers_for_no_call_disturbs_nothing(mesh, socket_agent, router_logs):
    async def noisy(call) -> None:
        await call.socket.send_bytes(b"no envelope here")
        await call.socket.send_bytes(encode(Envelope(type="reply", id="nobody-asked", status=200), b"{}"))
        await call.socket.send_str("a text message")
        await call.reply({"real": call.envelope.id})

    await mesh.add(await socket_agent("ws-noisy", noisy), "ws.noisy")
    answers = await asyncio.gather(*(mesh.call("ws.noisy", n, request_id=f"noisy-{n}") for n in range(5)))
    assert [answer.body["result"] for answer in answers] == [{"real": f"noisy-{n}"} for n in range(5)]
    refused = router_logs.named("websocket_message_refused")
    assert any(line.get("request_id") == "nobody-asked" for line in refused)
    assert any("no envelope" in line["why"] for line in refused)


async def test_a_garbage_answer_frame_is_the_agents_error_and_fails_over(mesh, socket_agent):
    async def garbage(call) -> None:
        await call.send("reply", b"{not json", status=200)

    async def answers(call) -> None:
        await call.reply("clean")

    await mesh.add(await socket_agent("ws-garbage", garbage), "ws.garbage", idempotent=True)
    await mesh.add(await socket_agent("ws-clean", answers), "ws.garbage", idempotent=True)
    await mesh.put_policy("ws.garbage", RETRY)
    assert [(await mesh.call("ws.garbage", n)).body["result"] for n in range(4)] == ["clean"] * 4


async def test_a_registration_naming_an_unknown_protocol_is_refused_naming_the_field(mesh, http):
    body = {"agent_id": "grpcish", "capabilities": [{"name": "x", "endpoint": "http://127.0.0.1:9/x",
                                                     "protocol": "carrier-pigeon"}]}
    async with http.post(f"{mesh.registry.url}/register", json=body) as response:
        refused = await response.json()
    assert response.status == 400
    assert refused["field"] == "capabilities[0].protocol", refused


async def test_an_agent_that_stops_reading_cannot_hold_a_call_past_its_deadline(mesh, socket_agent):
    async def answers(call) -> None:
        await call.reply("read")

    deaf = await socket_agent("ws-deaf", answers)
    await mesh.add(deaf, "ws.deaf", max_payload_bytes=1024 * 1024)
    await mesh.put_policy("ws.deaf", {"timeout": {"first_byte_ms": 500, "total_ms": 5000}})
    assert (await mesh.call("ws.deaf", "warm")).body["result"] == "read"
    deaf.reading.clear()
    big = "x" * 900_000
    # Without a deadline on its writes the router would wait on this agent for ever: the guard is the test's.
    answers_seen = await asyncio.wait_for(asyncio.gather(*(mesh.call("ws.deaf", big) for _ in range(24))), 20)
    codes = [answer.body.get("error_code") for answer in answers_seen]
    # The one message the agent had taken before it stopped is answered; the calls whose messages waited on its
    # buffers time out, and those on the connection the router then dropped are lost with it.
    assert set(codes) <= {None, "FIRST_BYTE_TIMEOUT", "AGENT_ERROR"} and "FIRST_BYTE_TIMEOUT" in codes, codes
    assert codes.count(None) <= 1, codes
    deaf.reading.set()
    # The router gave the stuck connection up: the agent, reading again, finds it closed.
    await wait_for(lambda: deaf.closed >= 1, timeout=5, what="the router to drop the connection it could not write")


async def test_an_answer_past_the_routers_cap_fails_its_connection_and_nothing_else(start_mesh, socket_agent):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=64 * 1024))

    async def huge(call) -> None:
        await call.reply("x" * 200_000)

    async def small(call) -> None:
        await call.reply("fits")

    await mesh.add(await socket_agent("ws-huge", huge), "ws.huge")
    await mesh.add(await socket_agent("ws-small", small), "ws.small")
    answer = await mesh.call("ws.huge", "big please")
    assert (answer.status, answer.body["error_code"]) == (502, "AGENT_ERROR")
    assert "connection was lost" in answer.body["error_message"] and "exceeds limit" in answer.body["error_message"]
    assert (await mesh.call("ws.small", "and you?")).body["result"] == "fits"
