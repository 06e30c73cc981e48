"""Streamed answers SDK to SDK: handlers that are async generators, read through the real router with
ReachClient.stream, the sync client's iterator and curl."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from agent_reach import BusinessFailure, ReachClient, ReachError
from agent_reach.atp import ResponseFrame
from agent_reach.client import SyncReachClient
from agent_reach.sse import ChunkFrame

from conftest import wait_for

CHUNKS = 10
EVERY = 0.2


@pytest.fixture
async def streaming(mesh, make_agent):
    """One SDK agent with a ticking capability and a few that fail in their own ways; ``produced`` holds
    when each tick was yielded, ``cancelled`` when a handler saw CancelledError."""
    agent = make_agent("streamer-1", mesh.registry.url)
    produced: list[float] = []
    cancelled: list[float] = []

    @agent.capability("s.tick", timeout_sla_ms=10_000)
    async def tick(payload, ctx):
        try:
            for n in range(CHUNKS):
                if n:
                    await asyncio.sleep(EVERY)
                produced.append(time.monotonic())
                yield f"{payload}-{n}"
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise

    @agent.capability("s.refuses", timeout_sla_ms=2000)
    async def refuses(payload, ctx):
        yield "one"
        yield "two"
        raise BusinessFailure("quota", "no more today")

    @agent.capability("s.crashes", timeout_sla_ms=2000)
    async def crashes(payload, ctx):
        raise ValueError("before any chunk")
        yield  # an async generator all the same

    @agent.capability("s.unencodable", timeout_sla_ms=2000)
    async def unencodable(payload, ctx):
        yield "fine"
        yield object()

    @agent.capability("s.overruns", timeout_sla_ms=500)
    async def overruns(payload, ctx):
        yield "started"
        await asyncio.sleep(30)
        yield "never"

    @agent.capability("s.plain", timeout_sla_ms=2000)
    async def plain(payload, ctx):
        return {"whole": payload}

    await agent.start()
    await mesh.until_state("streamer-1")
    return produced, cancelled


async def collect(client, capability, payload="p"):
    chunks, arrivals, final = [], [], None
    async for item in client.stream(capability, payload):
        if isinstance(item, ChunkFrame):
            chunks.append(item)
            arrivals.append(time.monotonic())
        else:
            final = item
    return chunks, arrivals, final


async def failing(client, capability) -> tuple[list, ReachError]:
    """The chunks read before the stream raised, and what it raised."""
    seen = []
    try:
        async for item in client.stream(capability, None):
            seen.append(item.data)
    except ReachError as error:
        return seen, error
    raise AssertionError(f"{capability} did not fail")


async def test_reach_client_streams_chunks_as_they_are_produced(mesh, streaming):
    produced, _ = streaming
    async with ReachClient(mesh.url) as client:
        chunks, arrivals, final = await collect(client, "s.tick", "t")
    assert [(c.seq, c.data) for c in chunks] == [(n, f"t-{n}") for n in range(CHUNKS)]
    assert arrivals[0] < produced[-1]  # streamed as made, not gathered (see the curl test)
    assert all(made <= arrived for made, arrived in zip(produced, arrivals, strict=True))
    assert isinstance(final, ResponseFrame) and final.result == f"t-{CHUNKS - 1}"
    assert final.route.instance == "streamer-1" and client.last_route == final.route


async def test_a_failure_after_chunks_raises_reach_error_once_they_are_read(mesh, streaming):
    async with ReachClient(mesh.url) as client:
        seen, error = await failing(client, "s.refuses")
        assert seen == ["one", "two"]
        assert error.error_code == "BUSINESS_ERROR" and error.business_error.code == "quota"
        seen, error = await failing(client, "s.crashes")
        assert seen == [] and error.error_code == "AGENT_ERROR" and "before any chunk" in str(error)
        seen, error = await failing(client, "s.unencodable")
        assert seen == ["fine"] and error.error_code == "AGENT_ERROR"
        seen, error = await failing(client, "s.overruns")
        assert seen == ["started"] and error.error_code == "TOTAL_TIMEOUT"


async def test_a_handler_that_does_not_stream_answers_a_stream_with_its_final_frame(mesh, streaming):
    async with ReachClient(mesh.url) as client:
        chunks, _, final = await collect(client, "s.plain", 7)
        assert chunks == [] and final.result == {"whole": 7}
        # ...and a streaming handler answers a plain call with its last chunk.
        assert await client.call("s.tick", "c") == f"c-{CHUNKS - 1}"


async def test_leaving_the_loop_early_cancels_the_handler(mesh, streaming):
    _, cancelled = streaming
    async with ReachClient(mesh.url) as client:
        async with contextlib.aclosing(client.stream("s.tick", "x")) as chunks:
            async for item in chunks:
                assert item.seq == 0
                break
        left = time.monotonic()
        await wait_for(lambda: cancelled, timeout=1.0, what="the handler to be cancelled")
    assert cancelled[0] - left < 1.0


async def test_the_sync_client_streams_as_an_iterator(mesh, streaming):
    def read() -> list:
        with SyncReachClient(mesh.url) as client:
            return list(client.stream("s.tick", "sync"))

    items = await asyncio.to_thread(read)
    assert [item.data for item in items[:-1]] == [f"sync-{n}" for n in range(CHUNKS)]
    assert isinstance(items[-1], ResponseFrame) and items[-1].result == f"sync-{CHUNKS - 1}"


async def test_curl_reads_the_stream_as_it_is_produced(mesh, streaming):
    produced, _ = streaming
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sN", "-X", "POST", f"{mesh.url}/atp", "-H", "Accept: text/event-stream",
        "-H", "Content-Type: application/json", "-d", json.dumps({"capability": "s.tick", "payload": "curl"}),
        stdout=asyncio.subprocess.PIPE)
    assert curl.stdout is not None
    events, arrivals = [], []
    async for line in curl.stdout:
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
            arrivals.append(time.monotonic())
    assert await curl.wait() == 0
    assert [event.get("data") for event in events[:-1]] == [f"curl-{n}" for n in range(CHUNKS)]
    assert events[-1]["status"] == "success" and events[-1]["route"]["instance"] == "streamer-1"
    # Relayed as produced, not gathered: the first tick reached curl before the agent made the last one (nine
    # ticks later), a causal order a loaded machine cannot upset as it could a bound in milliseconds.
    assert arrivals[0] < produced[-1]
    assert all(made <= arrived for made, arrived in zip(produced, arrivals[:-1], strict=True))
