"""Signed forwards over a message queue, as over HTTP: the router signs each call for the capability's stream and
its own reply stream, the SDK agent (holding a registration token) serves those and refuses, logs and
dead-letters entries that did not come from the router (unsigned, forged, signed for another stream, a forged
reply stream, a replay) without answering them anywhere, while the router's calls go on."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agent_reach import ReachClient
from agent_reach.headers import DEADLINE_HEADER, REPLY_TO_HEADER, REQUEST_ID_HEADER, SIGNATURE_HEADER
from agent_reach.mq_wire import FIELD, METHOD
from agent_reach.signing import sign, signing_key
from agent_reach.socket_wire import Envelope, decode, encode

from conftest import wait_for

STREAM = "agentreach.mqauth.mqauth.echo"


def mq_counting_agent(make_agent, agent_id: str, mesh, broker: str, token: str, **options: Any):
    agent = make_agent(agent_id, mesh.registry.url, registration_token=token, broker=broker, service="mqauth",
                       **options)
    ran: list[Any] = []
    release = asyncio.Event()
    release.set()

    @agent.capability("mqauth.echo", protocol="mq")
    async def echo(payload, ctx):
        ran.append(payload)
        await release.wait()
        return {"echo": payload}

    return agent, ran, release


def entry(request_id: str, reply_to: str, body: bytes, signature: str | None) -> dict[bytes, bytes]:
    headers = {REQUEST_ID_HEADER: request_id, REPLY_TO_HEADER: reply_to,
               DEADLINE_HEADER: str(int((time.time() + 30) * 1000))}
    if signature is not None:
        headers[SIGNATURE_HEADER] = signature
    return {FIELD: encode(Envelope(type="call", id=f"call-{request_id}", headers=headers), body)}


def frame(request_id: str, payload: Any) -> bytes:
    return json.dumps({"capability": "mqauth.echo", "payload": payload, "request_id": request_id}).encode()


async def test_signed_calls_are_served_and_entries_around_the_router_refused(mq_token_mesh, make_agent,
                                                                             redis_server, router_logs):
    issued = await mq_token_mesh.token("mqauth")
    agent, ran, _ = mq_counting_agent(make_agent, "mqauth-1", mq_token_mesh, redis_server.url, issued["token"])
    await agent.start()
    await mq_token_mesh.routable("mqauth-1")
    async with ReachClient(mq_token_mesh.router.url) as client:
        assert await client.call("mqauth.echo", {"n": 1}) == {"echo": {"n": 1}}
    assert ran == [{"n": 1}]

    key, mine, theirs = signing_key(issued["token"]), "test.replies.mine", "test.replies.theirs"
    refused = [
        entry("sneak-1", mine, frame("sneak-1", 2), None),
        entry("sneak-2", mine, frame("sneak-2", 3),
              sign(signing_key("art_forged"), STREAM, METHOD, mine, "sneak-2", frame("sneak-2", 3))),
        entry("sneak-3", mine, frame("sneak-3", 4),
              sign(key, "agentreach.other.stream", METHOD, mine, "sneak-3", frame("sneak-3", 4))),
        # Signed for one reply stream, sent with another: an answer must never be steered elsewhere.
        entry("sneak-4", theirs, frame("sneak-4", 5), sign(key, STREAM, METHOD, mine, "sneak-4", frame("sneak-4", 5))),
        # Signed right for other bytes: a payload changed on its way.
        entry("sneak-5", mine, frame("sneak-5", 7), sign(key, STREAM, METHOD, mine, "sneak-5", frame("sneak-5", 6))),
    ]
    for fields in refused:
        await redis_server.client.xadd(STREAM, fields)
    # The positive control: the right key, stream and reply stream, once; its replay is refused.
    genuine = entry("own-1", mine, frame("own-1", 8), sign(key, STREAM, METHOD, mine, "own-1", frame("own-1", 8)))
    await redis_server.client.xadd(STREAM, genuine)
    answered = await wait_for(lambda: redis_server.client.xrange(mine), timeout=5, what="the genuine entry answered")
    envelope, body = decode(answered[0][1][FIELD])
    assert (envelope.type, envelope.id, envelope.status) == ("reply", "call-own-1", 200)
    assert json.loads(body)["result"] == {"echo": 8}
    await redis_server.client.xadd(STREAM, genuine)
    await wait_for(lambda: agent.mq is not None and agent.mq.counts["refused"] == 6, timeout=5,
                   what="every entry around the router refused")
    whys = {line["call_id"]: line["why"] for line in router_logs.named("mq_message_refused")}
    assert "missing X-Reach-Signature" in whys["call-sneak-1"], whys
    assert all("does not match" in whys[f"call-sneak-{n}"] for n in (2, 3, 4, 5)), whys
    assert "replayed" in whys["call-own-1"], whys
    assert len(await redis_server.dead_letters(STREAM)) == 6
    assert len(await redis_server.client.xrange(mine)) == 1  # the control's answer, nothing more
    assert await redis_server.client.exists(theirs) == 0
    assert ran == [{"n": 1}, 8]
    async with ReachClient(mq_token_mesh.router.url) as client:
        assert await client.call("mqauth.echo", 9) == {"echo": 9}


async def test_a_routed_call_copied_with_a_forged_reply_stream_is_refused_and_nothing_else_disturbed(
        mq_token_mesh, make_agent, redis_server, router_logs):
    """The router's own signed entry, copied while it waits in the stream: sent elsewhere it does not verify,
    sent again unchanged it is a replay; the router's call is answered once."""
    issued = await mq_token_mesh.token("mqauth")
    agent, ran, release = mq_counting_agent(make_agent, "mqauth-2", mq_token_mesh, redis_server.url,
                                            issued["token"], max_inflight=1)
    await agent.start()
    await mq_token_mesh.routable("mqauth-2")
    release.clear()
    async with ReachClient(mq_token_mesh.router.url) as client:
        holding = asyncio.create_task(client.call("mqauth.echo", "holds the only slot"))
        await wait_for(lambda: ran == ["holds the only slot"], timeout=5, what="the first call to run")
        waiting = asyncio.create_task(client.call("mqauth.echo", "waits"))
        [(_, fields)] = await wait_for(lambda: redis_server.client.xrange(STREAM), timeout=5,
                                       what="the second call queued")
        envelope, body = decode(fields[FIELD])
        forged = Envelope(type="call", id=envelope.id, headers={**envelope.headers, REPLY_TO_HEADER: "evil.replies"})
        await redis_server.client.xadd(STREAM, {FIELD: encode(forged, body)})
        await redis_server.client.xadd(STREAM, fields)
        release.set()
        assert await holding == {"echo": "holds the only slot"}
        assert await waiting == {"echo": "waits"}
    await wait_for(lambda: agent.mq is not None and agent.mq.counts["refused"] == 2, timeout=5,
                   what="the copies refused")
    whys = [line["why"] for line in router_logs.named("mq_message_refused")]
    assert len(whys) == 2 and "does not match" in whys[0] and "replayed" in whys[1], whys
    assert await redis_server.client.exists("evil.replies") == 0
    assert ran == ["holds the only slot", "waits"]
    metrics = await mq_token_mesh.http.get(f"{mq_token_mesh.router.url}/metrics")
    assert "agentreach_router_mq_duplicates_total 0.0" in await metrics.text()
    assert len(await redis_server.dead_letters(STREAM)) == 2
