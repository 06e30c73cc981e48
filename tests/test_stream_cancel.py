"""A caller leaving a streamed call: the router cancels the agent's request at once, and the SDK cancels
the handler (it sees CancelledError), whether it was yielding chunks or silent at the time."""

from __future__ import annotations

import asyncio
import time

from conftest import wait_for
from stream_support import read_stream


async def watched_agent(mesh, make_agent, agent_id, name, *, silent_after: int | None = None):
    """An SDK agent streaming a chunk every 100 ms (or going silent after ``silent_after`` chunks);
    the moment its handler saw CancelledError goes in ``cancelled``."""
    agent = make_agent(agent_id, mesh.registry.url)
    cancelled: list[float] = []

    @agent.capability(name, timeout_sla_ms=30_000)
    async def ticks(payload, ctx):
        n = 0
        try:
            while True:
                yield n
                n += 1
                await asyncio.sleep(3600 if n == silent_after else 0.1)
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise

    await agent.start()
    await mesh.until_state(agent_id)
    return agent, cancelled


async def leave_after(chunks: int, left: list[float]):
    async def on_chunk(streamed) -> bool:
        if len(streamed.chunks) < chunks:
            return False
        left.append(time.monotonic())
        return True
    return on_chunk


async def test_a_caller_leaving_mid_stream_cancels_the_handler_within_a_second(mesh, make_agent, http):
    agent, cancelled = await watched_agent(mesh, make_agent, "watched-1", "stream.watched")
    left: list[float] = []
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.watched", "request_id": "gone-1"},
                                 on_chunk=await leave_after(3, left))
    assert len(streamed.chunks) == 3
    await wait_for(lambda: cancelled, timeout=1.0, what="the handler to be cancelled")
    assert cancelled[0] - left[0] < 1.0
    await wait_for(lambda: agent.inflight.count == 0, timeout=1.0, what="the call to leave the agent")
    trace = (await mesh.get("/traces/gone-1"))["call"]
    assert trace["error_code"] == "CANCELLED" and trace["chunks"] >= 3 and trace["streamed"] is True


async def test_a_caller_leaving_while_the_handler_is_silent_cancels_it_too(mesh, make_agent, http):
    _, cancelled = await watched_agent(mesh, make_agent, "silent-1", "stream.silent", silent_after=2)
    left: list[float] = []
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "stream.silent"},
                                 on_chunk=await leave_after(2, left))
    assert [c["data"] for c in streamed.chunks] == [0, 1]
    # No chunk is coming to notice the hang-up by.
    await wait_for(lambda: cancelled, timeout=1.0, what="the handler to be cancelled")
    assert cancelled[0] - left[0] < 1.0
