"""Streamed answers through the real router: an SDK agent whose handler is an async generator, and plain
rest agents answering text/event-stream, called over real HTTP with `Accept: text/event-stream`."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import wait_for
from recording_support import starting
from router.core import RouterSettings
from stream_support import Drop, StreamingRestAgent, read_stream, sse

CHUNKS = 10
EVERY = 0.2


@pytest.fixture
async def start_streaming_agent():
    async with starting(StreamingRestAgent) as start:
        yield start


async def ticking_agent(mesh, make_agent, agent_id="ticker-1", name="stream.tick", **options):
    """An SDK agent yielding CHUNKS chunks EVERY seconds apart, noting when it produced each."""
    agent = make_agent(agent_id, mesh.registry.url)
    produced: list[float] = []

    @agent.capability(name, timeout_sla_ms=10_000, **options)
    async def tick(payload, ctx):
        for n in range(CHUNKS):
            if n:
                await asyncio.sleep(EVERY)
            produced.append(time.monotonic())
            yield {"n": n, "of": payload}

    await agent.start()
    await mesh.until_state(agent_id)
    return produced


async def test_each_chunk_reaches_the_caller_while_the_agent_is_still_producing(mesh, make_agent, http):
    produced = await ticking_agent(mesh, make_agent)
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.tick", "payload": "p",
                                                           "request_id": "tick-1"})
    assert streamed.status == 200 and streamed.content_type == "text/event-stream"
    assert [(c["request_id"], c["seq"], c["data"]) for c in streamed.chunks] == \
        [("tick-1", n, {"n": n, "of": "p"}) for n in range(CHUNKS)]
    # Unbuffered: the first chunk is at the caller while the agent still has 9 to produce (the next one 200 ms
    # away), and none arrives before it was made: a causal order, not a bound a loaded machine can break.
    assert all(made <= arrived for made, arrived in zip(produced, streamed.arrivals, strict=True))
    assert streamed.arrivals[0] < produced[1]
    name, final = streamed.final
    assert name == "response" and final["status"] == "success" and final["result"] == {"n": 9, "of": "p"}
    assert final["route"]["instance"] == "ticker-1" and final["route"]["attempts"] == 1
    trace = (await mesh.get("/traces/tick-1"))["call"]
    assert (trace["streamed"], trace["chunks"], trace["outcome"]) == (True, CHUNKS, "success")
    assert trace["chunk_bytes"] == sum(len(f'{{"n":{n},"of":"p"}}') for n in range(CHUNKS))


async def test_the_stream_flag_in_the_frame_asks_for_a_stream_too(mesh, make_agent, http):
    await ticking_agent(mesh, make_agent)
    async with http.post(f"{mesh.url}/atp", json={"capability": "stream.tick", "payload": 1, "stream": True}) as answer:
        assert answer.content_type == "text/event-stream"
        assert (await answer.text()).count("event: chunk\n") == CHUNKS


async def test_a_caller_that_does_not_stream_gets_the_assembled_final_answer(mesh, make_agent):
    await ticking_agent(mesh, make_agent)
    answer = await mesh.call("stream.tick", "whole")
    assert answer.status == 200 and answer.body["result"] == {"n": 9, "of": "whole"}
    assert answer.headers["Content-Type"].startswith("application/json")


async def test_a_rest_agent_may_answer_a_stream_and_its_last_chunk_is_the_result(mesh, start_streaming_agent, http):
    async def script(response):
        for word in ("one", "two", "three"):
            await response.write(sse(None, word))

    agent = await start_streaming_agent("rest-stream-1", script)
    await mesh.add(agent, "stream.rest")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.rest", "payload": {}})
    assert [c["data"] for c in streamed.chunks] == ["one", "two", "three"]
    assert streamed.final[0] == "response" and streamed.final[1]["result"] == "three"
    assert agent.received[-1].headers["Accept"].startswith("text/event-stream")
    # Not streamed to the caller: assembled by the router.
    assert (await mesh.call("stream.rest", {})).body["result"] == "three"


async def test_a_chunk_written_over_several_lines_reaches_the_caller_as_one_event(mesh, start_streaming_agent, http):
    async def script(response):
        await response.write(b'event: chunk\ndata: {"a":\ndata:  [1,\r\ndata: 2]}\n\n')
        await response.write(sse("response", {"done": True}))

    agent = await start_streaming_agent("rest-lines-1", script)
    await mesh.add(agent, "stream.lines")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.lines"})
    assert [c["data"] for c in streamed.chunks] == [{"a": [1, 2]}]
    assert streamed.final[1]["result"] == {"done": True}


async def test_a_chunk_that_is_not_json_ends_the_stream_as_the_agents_failure(mesh, start_streaming_agent, http):
    async def script(response):
        await response.write(sse("chunk", "fine"))
        await response.write(b'event: chunk\ndata: 1}, "injected": {\n\n')

    agent = await start_streaming_agent("rest-bad-1", script)
    await mesh.add(agent, "stream.bad")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.bad"})
    assert [c["data"] for c in streamed.chunks] == ["fine"]
    name, error = streamed.final
    assert name == "error" and error["error_code"] == "AGENT_ERROR" and "not JSON" in error["error_message"]


async def test_a_stalled_stream_ends_with_an_idle_timeout(mesh, start_streaming_agent, http):
    async def script(response):
        await response.write(sse("chunk", "first"))
        await asyncio.Event().wait()  # never another word

    agent = await start_streaming_agent("stalled-1", script)
    await mesh.add(agent, "stream.stall")
    await mesh.put_policy("stream.stall", {"timeout": {"idle_ms": 300, "total_ms": 20_000}})
    started = time.monotonic()
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.stall", "request_id": "stall-1"})
    assert [c["data"] for c in streamed.chunks] == ["first"]
    name, error = streamed.final
    assert name == "error" and error["error_code"] == "IDLE_TIMEOUT" and error["can_retry"] is True
    assert "no chunk for 300 ms after 1 chunks" in error["error_message"]
    assert time.monotonic() - started < 20  # long before the total
    await asyncio.wait_for(agent.left.wait(), 5)  # the router hung up on it
    trace = (await mesh.get("/traces/stall-1"))["call"]
    assert (trace["error_code"], trace["chunks"]) == ("IDLE_TIMEOUT", 1)


async def test_a_stream_slower_than_its_total_ends_with_a_total_timeout(mesh, start_streaming_agent, http):
    async def script(response):
        n = 0
        while True:
            await response.write(sse("chunk", n))
            n += 1
            await asyncio.sleep(0.05)

    agent = await start_streaming_agent("endless-1", script)
    await mesh.add(agent, "stream.endless")
    await mesh.put_policy("stream.endless", {"timeout": {"idle_ms": 5000, "total_ms": 600}})
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.endless"})
    assert len(streamed.chunks) > 1
    name, error = streamed.final
    assert name == "error" and error["error_code"] == "TOTAL_TIMEOUT"
    await asyncio.wait_for(agent.left.wait(), 5)


async def test_the_answer_cap_holds_across_the_stream(start_mesh, start_streaming_agent, http):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=4096))

    async def script(response):
        while True:
            await response.write(sse("chunk", "x" * 1000))

    agent = await start_streaming_agent("flood-1", script)
    await mesh.add(agent, "stream.flood")
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.flood"})
    assert len(streamed.chunks) <= 4  # 4,096 bytes hold fewer than 4 of them with their event lines
    name, error = streamed.final
    assert name == "error" and error["error_code"] == "ANSWER_TOO_LARGE"
    await asyncio.wait_for(agent.left.wait(), 5)


async def test_a_call_refused_before_any_chunk_keeps_its_status(mesh, http):
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "nobody.here"})
    assert streamed.status == 404 and streamed.content_type == "text/event-stream"
    assert streamed.chunks == [] and streamed.final[1]["error_code"] == "UNKNOWN_CAPABILITY"


async def test_a_failover_happens_before_the_first_chunk_and_never_after(mesh, start_streaming_agent, http):
    async def dies(response):
        raise Drop  # before any event

    async def one_then_dies(response):
        await response.write(sse("chunk", "half"))
        raise Drop

    async def whole(response):
        await response.write(sse("chunk", "all"))
        await response.write(sse("response", "done"))

    first = await start_streaming_agent("first-1", dies)
    second = await start_streaming_agent("second-1", whole)
    await mesh.add_all([first, second], "stream.failover", idempotent=True)
    await mesh.heartbeat("second-1", load=0.9)  # least_load tries first-1 first
    await wait_for(lambda: mesh.router.mirror.states["second-1"].load == 0.9)
    await mesh.put_policy("stream.failover", {"retry": {"enabled": True, "max_attempts": 2}})
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.failover"})
    assert streamed.final[0] == "response" and streamed.final[1]["result"] == "done"
    assert [c["data"] for c in streamed.chunks] == ["all"]
    assert streamed.final[1]["route"]["attempts"] == 2 and streamed.final[1]["route"]["instance"] == "second-1"

    first.script = one_then_dies
    called = len(second.received)
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.failover"})
    assert [c["data"] for c in streamed.chunks] == ["half"]
    name, error = streamed.final
    assert name == "error" and error["error_code"] == "AGENT_ERROR"
    assert error["route"]["attempts"] == 1 and error["route"]["instance"] == "first-1"
    assert len(second.received) == called  # the broken stream did not go on elsewhere


async def test_a_caller_slow_to_read_is_not_an_idle_agent(start_mesh, start_streaming_agent, http):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=128 * 1024 * 1024))
    big = "y" * (1024 * 1024)

    async def script(response):
        for _ in range(40):  # 40 MiB: more than the sockets between router and caller hold
            await response.write(sse("chunk", big))

    agent = await start_streaming_agent("fast-1", script)
    await mesh.add(agent, "stream.fast")
    await mesh.put_policy("stream.fast", {"timeout": {"idle_ms": 300, "total_ms": 60_000}})

    async def slow_reader(streamed) -> bool:
        if len(streamed.chunks) == 1:
            await asyncio.sleep(1.5)  # the caller, not the agent, is slow: the router's writes wait on it
        return False

    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.fast"}, on_chunk=slow_reader)
    assert len(streamed.chunks) == 40 and streamed.final[0] == "response", streamed.final
