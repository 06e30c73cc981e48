"""bench/floor_router.py, the floor bench/datapath_bench.py measures the router against, does the work its
claim rests on: the caller's key checked, the payload forwarded with its request id and a signature the
agent can verify, the agent's answer framed, and every call's row in the audit trail."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import aiohttp
from agent_reach.headers import REQUEST_ID_HEADER, SIGNATURE_HEADER
from agent_reach.serving import listen
from agent_reach.signing import verify
from aiohttp import web

from recording_support import Received, RecordingServer
from test_audit import rows_in
from test_audit_writer import request_ids

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from floor_router import AGENT_ID, Floor, floor_app

KEY = "a-signing-key"
CALLS = 20


async def echo(request: web.Request, received: Received) -> web.Response:
    return web.Response(body=b'{"echo":' + received.body + b"}", content_type="application/json")


async def test_the_floor_checks_the_key_signs_the_forward_and_audits_every_call(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    agent = await RecordingServer(echo).start()
    trail = tmp_path / "floor.sqlite"
    runner, port = await listen(floor_app(Floor(f"{agent.url}/echo", "caller-key", KEY, trail)), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}/atp"
        async with http.post(url, json={"capability": "echo", "payload": {"n": 0}},
                             headers={"X-API-Key": "someone-else"}) as refused:
            assert refused.status == 401
        assert agent.received == []
        answers = []
        for n in range(CALLS):
            async with http.post(url, json={"capability": "echo", "payload": {"n": n}},
                                 headers={"X-API-Key": "caller-key"}) as response:
                assert response.status == 200
                answers.append(await response.json())
    finally:
        await runner.cleanup()  # stops the audit trail: its writer commits every row first
        await agent.stop()
    assert [answer["result"] for answer in answers] == [{"echo": {"n": n}} for n in range(CALLS)]
    forwarded = agent.at("/echo")
    assert [received.headers[REQUEST_ID_HEADER] for received in forwarded] == \
        [answer["request_id"] for answer in answers]
    for received in forwarded:
        assert verify(received.headers[SIGNATURE_HEADER], KEY, AGENT_ID, "POST", "/echo",
                      received.headers[REQUEST_ID_HEADER], received.body) is None
    assert rows_in(trail) == CALLS
    assert sorted(request_ids(trail)) == sorted(answer["request_id"] for answer in answers)


async def failing(request: web.Request, received: Received) -> web.Response:
    return web.Response(status=500, body=b"down")


async def test_bad_frames_are_refused_before_anything_is_forwarded_and_a_failing_agent_is_an_error_frame(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    agent = await RecordingServer(failing).start()
    trail = tmp_path / "floor.sqlite"
    runner, port = await listen(floor_app(Floor(f"{agent.url}/echo", "caller-key", KEY, trail)), "127.0.0.1", 0)
    key = {"X-API-Key": "caller-key"}
    try:
        url = f"http://127.0.0.1:{port}/atp"
        async with http.post(url, data=b"{not json", headers=key) as response:
            assert response.status == 400
            assert (await response.json())["error_code"] == "INVALID_FRAME"
        async with http.post(url, json={"capability": "echo", "request_id": "a\r\nX-Injected: 1"},
                             headers=key) as response:
            assert response.status == 400
            assert (await response.json())["field"] == "request_id"
        assert agent.received == []
        async with http.post(url, json={"capability": "echo", "payload": 1, "request_id": "r-1"},
                             headers=key) as response:
            assert response.status == 502
            assert await response.json() == {"request_id": "r-1", "error_code": "AGENT_ERROR",
                                             "error_message": "agent answered HTTP 500", "can_retry": True}
    finally:
        await runner.cleanup()
        await agent.stop()
    assert len(agent.at("/echo")) == 1
    with sqlite3.connect(trail) as db:
        assert db.execute("SELECT request_id, outcome, error_code FROM audit").fetchall() == \
            [("r-1", "failed", "AGENT_ERROR")]
