"""Message-queue agents failing, on a real redis-server, router and SDK agents: each of the three timeouts (the
handler cancelled, an idempotent call retried), a hung broker (connect: the call may be on it, so it is sent
once), the deadline travelling with the call, instances killed holding a call (answered once, by a sibling),
a poison call dead-lettered, and garbage in the request stream and in the router's reply stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agent_reach.headers import DEADLINE_HEADER, REPLY_TO_HEADER, REQUEST_ID_HEADER
from agent_reach.mq_wire import FIELD
from agent_reach.socket_wire import Envelope, decode, encode

from conftest import wait_for
from stream_support import read_stream

RETRY = {"retry": {"enabled": True, "max_attempts": 2}}


@pytest.fixture
async def mq_mesh(start_mesh, redis_server):
    return await start_mesh(router_settings={"broker": redis_server.url})


def stream_of(service: str, name: str) -> str:
    return f"agentreach.{service}.{name}"


async def attempts(mesh, request_id: str) -> list[tuple[str, str | None]]:
    return [(attempt["instance"], attempt["error_code"])
            for attempt in (await mesh.get(f"/traces/{request_id}"))["call"]["attempts"]]


async def test_a_silent_call_times_out_at_first_byte_is_cancelled_and_retried_when_idempotent(
        mq_mesh, make_agent, redis_server):
    """The retry goes to the same stream for the same request_id: the given-up attempt's cancel must not stop it
    (a race the cancel won more often than not before each attempt had an id of its own: three calls)."""
    ran: list[str] = []
    cancelled: list[str] = []
    agents = []
    for agent_id in ("mq-silent-1", "mq-silent-2"):
        agent = make_agent(agent_id, mq_mesh.registry.url, broker=redis_server.url, service="mq-silent")

        @agent.capability("mq.silent", protocol="mq", idempotent=True)
        async def silent(payload, ctx, agent_id=agent_id):
            ran.append(ctx.request_id)
            if len(ran) % 2 == 0:  # every call's second attempt answers
                return f"answered by {agent_id}"
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(ctx.request_id)
                raise

        await agent.start()
        await mq_mesh.until_state(agent_id)
        agents.append(agent)
    await mq_mesh.put_policy("mq.silent", {"timeout": {"first_byte_ms": 400, "total_ms": 5000}, **RETRY})
    for n in range(3):
        answer = await mq_mesh.call("mq.silent", n, request_id=f"silent-{n}")
        assert answer.status == 200 and answer.body["result"].startswith("answered by"), answer.body
        tried = await attempts(mq_mesh, f"silent-{n}")
        assert [code for _, code in tried] == ["FIRST_BYTE_TIMEOUT", None], tried
    await wait_for(lambda: cancelled == ["silent-0", "silent-1", "silent-2"], timeout=3,
                   what="each silent handler to be cancelled")
    assert ran == ["silent-0", "silent-0", "silent-1", "silent-1", "silent-2", "silent-2"]
    await wait_for(lambda: sum(agent.inflight.count for agent in agents) == 0, timeout=3, what="every call to end")
    await wait_for(lambda: sum(agent.mq.counts["cancelled"] for agent in agents) == 3, timeout=3,
                   what="the given-up attempts to be dropped")
    assert await redis_server.pending(stream_of("mq-silent", "mq.silent")) == []


async def test_a_stream_that_stalls_times_out_idle_and_one_that_never_ends_at_its_total(
        mq_mesh, make_agent, http, redis_server):
    agent = make_agent("mq-streams", mq_mesh.registry.url, broker=redis_server.url)
    cancelled: list[str] = []

    @agent.capability("mq.stall", protocol="mq")
    async def stalls(payload, ctx):
        yield "first"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("stall")
            raise

    @agent.capability("mq.endless", protocol="mq")
    async def endless(payload, ctx):
        try:
            for n in range(10_000):
                yield n
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            cancelled.append("endless")
            raise

    await agent.start()
    await mq_mesh.until_state("mq-streams")
    await mq_mesh.put_policy("mq.stall", {"timeout": {"idle_ms": 300, "total_ms": 20_000}})
    await mq_mesh.put_policy("mq.endless", {"timeout": {"idle_ms": 5000, "total_ms": 700}})
    stalled = await read_stream(http, f"{mq_mesh.url}/atp", {"capability": "mq.stall"})
    assert [chunk["data"] for chunk in stalled.chunks] == ["first"]
    assert stalled.final[0] == "error" and stalled.final[1]["error_code"] == "IDLE_TIMEOUT", stalled.final
    ended = await read_stream(http, f"{mq_mesh.url}/atp", {"capability": "mq.endless"})
    assert len(ended.chunks) > 1
    assert ended.final[0] == "error" and ended.final[1]["error_code"] == "TOTAL_TIMEOUT", ended.final
    await wait_for(lambda: sorted(cancelled) == ["endless", "stall"], timeout=3, what="both handlers cancelled")
    await wait_for(lambda: agent.inflight.count == 0, timeout=2, what="both calls to leave the agent")
    for name in ("mq.stall", "mq.endless"):
        assert await redis_server.pending(stream_of("mq-streams", name)) == []  # dropped, not redelivered


async def test_a_hung_broker_times_out_at_connect_and_the_call_is_sent_once(mq_mesh, make_agent, redis_server):
    """An append the broker did not confirm may be on it: a call not idempotent is not appended again, and the
    one that was is dropped unread once the broker wakes past the call's deadline."""
    ran: list[Any] = []
    agents = []
    for agent_id in ("mq-hung-1", "mq-hung-2"):
        agent = make_agent(agent_id, mq_mesh.registry.url, broker=redis_server.url, service="mq-hung")

        @agent.capability("mq.hung", protocol="mq")
        async def once(payload, ctx):
            ran.append(payload)
            return "ran"

        await agent.start()
        await mq_mesh.until_state(agent_id)
        agents.append(agent)
    await mq_mesh.put_policy("mq.hung", {"timeout": {"connect_ms": 300, "total_ms": 1500}, **RETRY})
    assert (await mq_mesh.call("mq.hung", "warm")).status == 200  # the router's connection to the broker is up
    with redis_server.paused():
        before = time.time()
        answer = await mq_mesh.call("mq.hung", "once", request_id="hung-1")
        assert (answer.status, answer.body["error_code"]) == (504, "CONNECT_TIMEOUT"), answer.body
        await wait_for(lambda: time.time() > before + 1.5, timeout=3, what="the call's deadline to pass")
    assert [code for _, code in await attempts(mq_mesh, "hung-1")] == ["CONNECT_TIMEOUT"]
    await wait_for(lambda: sum(agent.mq.counts["expired"] for agent in agents) >= 1, timeout=5,
                   what="the call that reached the broker to be dropped unread")
    assert sum(agent.mq.counts["expired"] for agent in agents) == 1
    assert ran == ["warm"]


async def test_the_deadline_travels_a_queued_call_runs_with_what_is_left_and_an_expired_one_is_dropped(
        mq_mesh, make_agent, redis_server):
    agent = make_agent("mq-queued", mq_mesh.registry.url, broker=redis_server.url, max_inflight=1)
    stream = stream_of("mq-queued", "mq.queued")
    release = asyncio.Event()
    seen: dict[str, tuple[float, float | None]] = {}

    @agent.capability("mq.queued", protocol="mq")
    async def queued(payload, ctx):
        seen[payload] = (time.time(), ctx.remaining())
        if payload == "first":
            await release.wait()
        return payload

    await agent.start()
    await mq_mesh.until_state("mq-queued")
    await mq_mesh.put_policy("mq.queued", {"timeout": {"first_byte_ms": 3000, "total_ms": 3000}})
    first = asyncio.create_task(mq_mesh.call("mq.queued", "first"))
    await wait_for(lambda: "first" in seen, timeout=3, what="the first call to hold the agent's only slot")
    waiting = asyncio.create_task(mq_mesh.call("mq.queued", "waits"))
    entries = await wait_for(lambda: redis_server.client.xrange(stream), timeout=3, what="the second call queued")
    deadline_s = int(decode(entries[-1][1][FIELD])[0].headers[DEADLINE_HEADER]) / 1000
    await wait_for(lambda: time.time() > deadline_s - 2.0, timeout=3, what="the call to wait a second queued")
    release.set()
    assert (await first).status == 200 and (await waiting).status == 200
    started, remaining = seen["waits"]
    assert remaining is not None and remaining <= deadline_s - started + 0.05, (remaining, deadline_s - started)

    # A call queued past its deadline (the caller's hint: 500 ms) is dropped unread.
    release.clear()
    del seen["first"]
    first = asyncio.create_task(mq_mesh.call("mq.queued", "first"))
    await wait_for(lambda: "first" in seen, timeout=3, what="the first call to hold the slot again")
    late = await mq_mesh.call("mq.queued", "late", timeout_hint=500)
    assert late.body["error_code"] in ("FIRST_BYTE_TIMEOUT", "TOTAL_TIMEOUT"), late.body
    release.set()
    await first
    await wait_for(lambda: agent.mq.counts["expired"] == 1, timeout=3, what="the late call to be dropped unread")
    assert "late" not in seen
    assert await redis_server.pending(stream) == []


async def test_an_instance_killed_holding_a_call_has_it_answered_once_by_a_sibling(
        mq_mesh, make_agent, redis_server, mq_agent_process):
    holder = await mq_agent_process(mq_mesh.registry.url, redis_server.url, "mq-holder", "--visibility-s", "0.6")
    await mq_mesh.until_state("mq-holder")
    await mq_mesh.put_policy("mq.child", {"timeout": {"first_byte_ms": 8000, "total_ms": 10_000}})
    call = asyncio.create_task(mq_mesh.call("mq.child", "hold", request_id="held-1"))
    await holder.until_logged("mq_test_holding")
    sibling = make_agent("mq-sibling", mq_mesh.registry.url, broker=redis_server.url, service="mq-child",
                         mq_visibility_s=0.6)
    ran: list[str] = []

    @sibling.capability("mq.child", protocol="mq")
    async def serve(payload, ctx):
        ran.append(ctx.request_id)
        return {"echo": payload, "served_by": "mq-sibling"}

    await sibling.start()
    await holder.kill()
    answer = await call
    assert answer.status == 200, answer.body
    assert answer.body["result"] == {"echo": "hold", "served_by": "mq-sibling"}
    assert ran == ["held-1"]
    assert sibling.mq is not None and sibling.mq.counts["redeliveries"] == 1
    assert [code for _, code in await attempts(mq_mesh, "held-1")] == [None]
    metrics = await mq_mesh.get("/metrics")
    assert "agentreach_router_mq_redelivered_total 1.0" in metrics
    assert "agentreach_router_mq_duplicates_total 0.0" in metrics
    totals = await mq_mesh.reach_totals("mq.child")
    assert (totals["total"], totals["success"]) == (1, 1), totals
    assert await redis_server.pending(stream_of("mq-child", "mq.child")) == []


async def test_killed_mq_agents_lose_no_idempotent_call(mq_mesh, redis_server, mq_agent_process):
    processes = [await mq_agent_process(mq_mesh.registry.url, redis_server.url, f"mq-kill-{n}", "--idempotent",
                                        "--visibility-s", "0.6") for n in (1, 2)]
    for n in (1, 2):
        await mq_mesh.until_state(f"mq-kill-{n}")
    await mq_mesh.put_policy("mq.child", {"timeout": {"first_byte_ms": 8000, "total_ms": 10_000}, **RETRY})
    statuses: list[int] = []

    async def caller(worker: int) -> None:
        for n in range(50):
            answer = await mq_mesh.call("mq.child", f"w{worker} n{n}")
            statuses.append(answer.status)
            if answer.status != 200:
                raise AssertionError(answer.body)
            if worker == 0 and n == 15:
                await processes[0].kill()

    await asyncio.gather(*(caller(worker) for worker in range(4)))
    assert statuses.count(200) == 200
    totals = await mq_mesh.reach_totals("mq.child")
    assert (totals["total"], totals["success"]) == (200, 200), totals


async def test_a_poison_call_is_dead_lettered_after_max_deliveries(mq_mesh, redis_server, mq_agent_process):
    """Every instance taking it dies: after two deliveries the third instance dead-letters it and answers."""
    processes = [await mq_agent_process(mq_mesh.registry.url, redis_server.url, f"mq-poison-{n}",
                                        "--visibility-s", "0.6", "--max-deliveries", "2") for n in (1, 2, 3)]
    for n in (1, 2, 3):
        await mq_mesh.until_state(f"mq-poison-{n}")
    await mq_mesh.put_policy("mq.child", {"timeout": {"first_byte_ms": 15_000, "total_ms": 20_000}})
    answer = await mq_mesh.call("mq.child", "poison", request_id="poison-1")
    assert (answer.status, answer.body["error_code"]) == (502, "AGENT_ERROR"), answer.body
    assert "dead-lettered after 2 deliveries" in answer.body["error_message"]
    assert sum(1 for process in processes if process.process.returncode is not None) == 2
    stream = stream_of("mq-child", "mq.child")
    [dead] = await redis_server.dead_letters(stream)
    assert dead[b"deliveries"] == b"3" and b"dead-lettered" in dead[b"reason"], dead
    assert decode(dead[FIELD])[0].headers[REQUEST_ID_HEADER] == "poison-1"
    assert await redis_server.pending(stream) == []
    metrics = await mq_mesh.get("/metrics")
    assert "agentreach_router_mq_dead_lettered_total 1.0" in metrics
    survivor = next(process for process in processes if process.process.returncode is None)
    assert len(survivor.logged("mq_call_dead_lettered")) == 1
    after = await mq_mesh.call("mq.child", "fine")
    assert after.status == 200 and after.body["result"]["served_by"] == survivor.logged(
        "mq consumer started")[0]["consumer"]


def call_entry(request_id: str, headers: dict[str, str], body: bytes) -> bytes:
    return encode(Envelope(type="call", id=request_id, headers={REQUEST_ID_HEADER: request_id, **headers}), body)


async def test_garbage_in_the_request_stream_is_dead_lettered_and_the_consumer_serves_on(
        mq_mesh, make_agent, redis_server, router_logs):
    agent = make_agent("mq-garbage", mq_mesh.registry.url, broker=redis_server.url)
    ran: list[Any] = []

    @agent.capability("mq.garbage", protocol="mq")
    async def echo(payload, ctx):
        ran.append(payload)
        return payload

    await agent.start()
    await mq_mesh.until_state("mq-garbage")
    stream = stream_of("mq-garbage", "mq.garbage")
    deadline = str(int((time.time() + 30) * 1000))
    frame = b'{"capability":"mq.garbage","payload":"sneaked"}'
    garbage = [
        {FIELD: b"\xff\xfe not an envelope at all"},
        {FIELD: b'{"type":"call","id":"g-1","headers":{"X-Reach-Reply-To":"x"}}'},  # no newline: no envelope
        {FIELD: b'{"type":"call","id":"g-2","headers":{"X-Reach-Reply-To":7}}\n{}'},
        {FIELD: b'{"type":"call","id":"","headers":{}}\n{}'},
        {b"other": b"an entry without the field"},
        {FIELD: call_entry("g-3", {REPLY_TO_HEADER: "agentreach.replies.x"}, frame)},  # no deadline
        {FIELD: call_entry("g-4", {REPLY_TO_HEADER: "agentreach.replies.x", DEADLINE_HEADER: "soon"}, frame)},
        {FIELD: call_entry("g-5", {REPLY_TO_HEADER: "not a stream name!", DEADLINE_HEADER: deadline}, frame)},
        {FIELD: call_entry("g-6", {DEADLINE_HEADER: deadline}, frame)},  # no reply stream
        {FIELD: encode(Envelope(type="reply", id="g-7", status=200), b"{}")},
        {FIELD: call_entry("g-8", {REPLY_TO_HEADER: "agentreach.replies.x", DEADLINE_HEADER: "١٢٣"}, frame)},
    ]
    for fields in garbage:
        await redis_server.client.xadd(stream, fields)
    await wait_for(lambda: agent.mq.counts["refused"] == len(garbage), timeout=5, what="every entry refused")
    assert len(await redis_server.dead_letters(stream)) == len(garbage)
    assert len(router_logs.named("mq_message_refused")) == len(garbage)
    assert await redis_server.pending(stream) == []
    assert await redis_server.client.exists("agentreach.replies.x") == 0  # nothing answered
    answer = await mq_mesh.call("mq.garbage", "after")
    assert (answer.status, answer.body["result"]) == (200, "after")
    assert ran == ["after"]


async def test_garbage_in_the_reply_stream_disturbs_no_call(mq_mesh, make_agent, redis_server, router_logs):
    agent = make_agent("mq-replies", mq_mesh.registry.url, broker=redis_server.url)
    release = asyncio.Event()

    @agent.capability("mq.replies", protocol="mq")
    async def slow(payload, ctx):
        await release.wait()
        return payload

    await agent.start()
    await mq_mesh.until_state("mq-replies")
    calls = [asyncio.create_task(mq_mesh.call("mq.replies", n, request_id=f"replies-{n}")) for n in range(5)]
    await wait_for(lambda: agent.inflight.count == 5, timeout=3, what="five calls in the agent")
    replies = mq_mesh.router.forwarder.queues.reply_stream
    for fields in ({FIELD: b"\x00garbage"}, {b"other": b"no field"}, {FIELD: b'{"type":"reply"}\n'},
                   {FIELD: encode(Envelope(type="call", id="replies-1"), b"{}")},
                   {FIELD: encode(Envelope(type="reply", id="nobody", status=200), b"{}")},
                   {FIELD: encode(Envelope(type="chunk", id="nobody"), b"{}")}):
        await redis_server.client.xadd(replies, fields)
    await wait_for(lambda: len(router_logs.named("mq_reply_refused")) >= 6, timeout=3, what="garbage refused")
    release.set()
    answers = await asyncio.gather(*calls)
    assert [(answer.status, answer.body["result"]) for answer in answers] == [(200, n) for n in range(5)]
    assert (await mq_mesh.call("mq.replies", "later")).status == 200


async def test_a_caller_leaving_while_the_mq_handler_is_silent_cancels_it(mq_mesh, make_agent, http, redis_server):
    """No chunk is coming to notice the hang-up by: the router's cancel on the stream's channel stops it."""
    agent = make_agent("mq-left", mq_mesh.registry.url, broker=redis_server.url)
    cancelled: list[float] = []

    @agent.capability("mq.left", protocol="mq")
    async def ticks(payload, ctx):
        try:
            yield 0
            yield 1
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise

    await agent.start()
    await mq_mesh.until_state("mq-left")
    left: list[float] = []

    async def leave(streamed) -> bool:
        if len(streamed.chunks) < 2:
            return False
        left.append(time.monotonic())
        return True

    streamed = await read_stream(http, f"{mq_mesh.url}/atp", {"capability": "mq.left", "request_id": "left-1"},
                                 on_chunk=leave)
    assert [chunk["data"] for chunk in streamed.chunks] == [0, 1]
    await wait_for(lambda: cancelled, timeout=2.0, what="the silent handler to be cancelled")
    assert cancelled[0] - left[0] < 1.0
    await wait_for(lambda: agent.mq.counts["cancelled"] == 1, timeout=2.0, what="the cancel to be counted")
    assert (await mq_mesh.get("/traces/left-1"))["call"]["error_code"] == "CANCELLED"
    assert await redis_server.pending(stream_of("mq-left", "mq.left")) == []


async def test_a_claimed_call_is_dead_lettered_by_its_own_delivery_count_however_much_the_claimer_holds(
        mq_mesh, make_agent, redis_server):
    """The claimer holds older entries than the one it claims: the count read is the claimed entry's own."""
    agent = make_agent("mq-claimer", mq_mesh.registry.url, broker=redis_server.url, max_inflight=5,
                       mq_visibility_s=0.6, mq_max_deliveries=2)
    stream = stream_of("mq-claimer", "mq.claimed")
    releases = {f"hold-{n}": asyncio.Event() for n in range(5)}
    ran: list[Any] = []

    @agent.capability("mq.claimed", protocol="mq")
    async def held(payload, ctx):
        ran.append(payload)
        if payload in releases:
            await releases[payload].wait()
        return payload

    await agent.start()
    await mq_mesh.until_state("mq-claimer")
    await mq_mesh.put_policy("mq.claimed", {"timeout": {"first_byte_ms": 15_000, "total_ms": 20_000}})
    holding = [asyncio.create_task(mq_mesh.call("mq.claimed", name)) for name in releases]
    await wait_for(lambda: len(ran) == 5, timeout=5, what="the agent to be full")
    poisoned = asyncio.create_task(mq_mesh.call("mq.claimed", "poison"))
    async def queued() -> bool:
        return await redis_server.client.xlen(stream) == 6

    await wait_for(queued, timeout=5, what="the call queued, untaken")
    # Two consumers take it and die holding it: it was delivered twice.
    await redis_server.client.xreadgroup("agentreach", "dead-1", {stream: ">"}, count=1)
    [entry_id] = [row["message_id"] for row in await redis_server.pending(stream)
                  if row["consumer"] == b"dead-1"]
    await redis_server.client.xclaim(stream, "agentreach", "dead-2", 0, [entry_id])
    releases["hold-0"].set()
    try:
        answer = await poisoned
    finally:
        for release in releases.values():
            release.set()
    assert (answer.status, answer.body.get("error_code")) == (502, "AGENT_ERROR"), answer.body
    assert "dead-lettered after 2 deliveries" in answer.body["error_message"]
    assert "poison" not in ran
    assert [(await call).status for call in holding] == [200] * 5
