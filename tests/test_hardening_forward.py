"""Hardening of the router's forward path, against real agents on 127.0.0.1: what a caller's frame may
put into headers, how large an agent's answer may be, and whose failure a failed call was.

No caller can open a breaker for everyone else (item 2); an answer past the cap is cut off while read
(3); control characters and huge ids never reach a header (5); any answer, however malformed, is a
documented ATP outcome (6); an agent's "your request is wrong" is the caller's error (18).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from agent_reach.atp import MAX_REQUEST_ID_CHARS, ErrorCode

from conftest import wait_for
from router.core import RouterSettings
from router_support import Mesh

BREAKER = {"min_requests": 5, "error_threshold_percent": 50, "reset_seconds": 30, "window_seconds": 60}


def breaker_counts(mesh: Mesh, capability: str = "echo") -> dict[str, tuple[str, int, int]]:
    """Every breaker of ``capability`` ("" for the capability's own): (state, requests, failures)."""
    now = time.monotonic()
    counts = {}
    for (scope, name), breaker in mesh.router.book.breakers():
        if (scope, name) == ("", capability) or scope == capability:
            snapshot = breaker.snapshot(now)
            counts[name if scope else ""] = (snapshot.state.value, snapshot.requests, snapshot.failures)
    return counts


# --- item 2: no caller opens a breaker for every caller ------------------------------------------------------

async def test_sixty_poisonous_calls_leave_the_breakers_closed_for_a_normal_caller(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER})
    agent = await start_agent("plain")
    await mesh.add(agent)
    huge_id = [await mesh.call(payload=i, request_id="r" * 9000) for i in range(20)]
    huge_context = [await mesh.call(payload=i, context={"blob": "c" * 65536}) for i in range(20)]
    assert {(a.status, a.body["error_code"], a.body["field"]) for a in huge_id} == \
        {(400, "INVALID_FRAME", "request_id")}
    assert {(a.status, a.body["error_code"], a.body["field"]) for a in huge_context} == \
        {(400, "INVALID_FRAME", "context")}
    assert agent.calls == 0
    # The agent itself refusing the request's form, 20 times: the caller's error, not the agent's.
    refused = []
    for status in (400, 413, 414, 422, 431) * 4:
        agent.status = status
        refused.append((status, (await mesh.call(payload="bad")).body["error_code"]))
    assert set(refused) == {(400, "INVALID_PAYLOAD"), (413, "PAYLOAD_TOO_LARGE"), (414, "INVALID_FRAME"),
                            (422, "INVALID_PAYLOAD"), (431, "INVALID_FRAME")}
    agent.status = 200
    normal = await mesh.call(payload="hello")
    assert normal.status == 200 and normal.body["result"] == {"echo": "hello", "agent": "plain"}
    assert breaker_counts(mesh) == {"": ("closed", 1, 0), "plain": ("closed", 1, 0)}


async def test_timeouts_a_callers_hint_brought_forward_are_not_the_agents(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER})
    agent = await start_agent("steady")
    agent.first_byte_delay = 0.2
    await mesh.add(agent)
    hurried = [await mesh.call(payload=i, timeout_hint=20) for i in range(30)]
    assert {(a.status, a.body["error_code"]) for a in hurried} == {(504, "TOTAL_TIMEOUT")}
    normal = await mesh.call(payload="patient")
    assert normal.status == 200 and normal.body["result"]["echo"] == "patient"
    assert breaker_counts(mesh) == {"": ("closed", 1, 0), "steady": ("closed", 1, 0)}
    # The capability's own deadline still counts: the agent is too slow for its SLA.
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER, "timeout": {"total_ms": 50}})
    assert (await mesh.call(payload="late")).body["error_code"] == "TOTAL_TIMEOUT"
    assert breaker_counts(mesh)["steady"] == ("closed", 2, 1)


async def test_a_context_just_within_the_bound_reaches_a_rest_agent_whole(mesh: Mesh, start_agent):
    agent = await start_agent("plain")
    await mesh.add(agent)
    context = {"blob": "c" * 4000}
    answer = await mesh.call(payload=1, context=context)
    assert answer.status == 200
    assert json.loads(agent.received[-1].headers["X-Reach-Context"])["blob"] == context["blob"]


# --- item 3: answers are bounded ----------------------------------------------------------------------------

@pytest.mark.parametrize("declare_length", [False, True])
async def test_an_answer_past_the_cap_is_cut_off_while_read(start_mesh, start_scripted, declare_length):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=1024 * 1024))
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER})
    agent = await start_scripted("flood")
    agent.stream, agent.declare_length = 256 * 1024 * 1024, declare_length
    await mesh.add(agent)
    answer = await mesh.call(payload=1)
    assert (answer.status, answer.body["error_code"], answer.body["can_retry"]) == (502, "ANSWER_TOO_LARGE", False)
    assert "1048576 bytes" in answer.body["error_message"]
    # The router hung up: the agent could not write its answer to the end, so nobody held it whole.
    await wait_for(agent.cut_off.is_set, timeout=10, what="the agent to see the router hang up")
    assert agent.written < agent.stream
    # Counted against the instance (and the capability): an agent that floods is a failing agent.
    assert breaker_counts(mesh) == {"": ("closed", 1, 1), "flood": ("closed", 1, 1)}
    trace = await mesh.get(f"/traces/{answer.body['request_id']}")
    assert trace["call"]["error_code"] == "ANSWER_TOO_LARGE"


async def test_an_answer_at_the_cap_passes(start_mesh, start_scripted):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=1024 * 1024))
    agent = await start_scripted("full")
    agent.body = b'"' + b"a" * (1024 * 1024 - 2) + b'"'
    await mesh.add(agent)
    answer = await mesh.call(payload=1)
    assert answer.status == 200 and len(answer.body["result"]) == 1024 * 1024 - 2


# --- item 5: nothing a caller sends reaches a header unchecked ----------------------------------------------

BAD_IDS = ["a\r\nX-Injected: 1", "a\nb", "\x00", "a\x01b", "x\x1f", "with space", "é", "", "r" * 65536,
           "r" * (MAX_REQUEST_ID_CHARS + 1), "trailing\n"]
BAD_CAPABILITIES = ["echo\r\nX-Injected: 1", "echo\n", "\x00", "e\x01", "with space", "c" * 65536, "-echo"]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_bad_request_id_is_refused_naming_it_and_never_reflected(mesh: Mesh, start_agent, bad):
    agent = await start_agent("plain")
    await mesh.add(agent)
    for name in ("echo", "unknown"):
        answer = await mesh.post({"capability": name, "payload": 1, "request_id": bad},
                                 headers={"X-Reach-Route-Headers": "on"})
        assert (answer.status, answer.body["error_code"], answer.body["field"]) == (400, "INVALID_FRAME", "request_id")
        assert answer.body["request_id"] != bad and answer.headers["X-Request-Id"] == answer.body["request_id"]
        assert "X-Injected" not in answer.headers
        assert not bad or all(bad not in value for value in answer.headers.values())
    assert agent.calls == 0 and (await mesh.get("/healthz"))["status"] == "ok"


@pytest.mark.parametrize("bad", BAD_CAPABILITIES)
async def test_a_bad_capability_name_is_refused_naming_it(mesh: Mesh, bad):
    answer = await mesh.post({"capability": bad, "payload": 1, "request_id": "cap-1"},
                             headers={"X-Reach-Route-Headers": "on"})
    assert (answer.status, answer.body["error_code"], answer.body["field"]) == (400, "INVALID_FRAME", "capability")
    assert answer.headers["X-Request-Id"] == "cap-1" and "X-Injected" not in answer.headers
    assert "X-Reach-Capability" not in answer.headers


async def test_a_valid_request_id_of_the_longest_length_goes_through(mesh: Mesh, start_agent):
    agent = await start_agent("plain")
    await mesh.add(agent)
    longest = "!~" * (MAX_REQUEST_ID_CHARS // 2)
    answer = await mesh.call(payload=1, request_id=longest)
    assert answer.status == 200 and answer.headers["X-Request-Id"] == longest
    assert agent.received[-1].headers["X-Request-Id"] == longest


async def test_json_rpc_with_a_control_character_id_is_answered_and_not_reflected(mesh: Mesh, start_agent):
    agent = await start_agent("plain")
    await mesh.add(agent)
    answer = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "id": "a\r\nX-Injected: 1",
                              "params": {"capability": "echo", "payload": 1}})
    assert answer.status == 200 and answer.body["id"] == "a\r\nX-Injected: 1"
    assert "X-Injected" not in answer.headers


# --- items 6 and 18: any answer is a documented outcome; "your request is wrong" is the caller's --------------

def frame_answer(**members: Any) -> bytes:
    return json.dumps({"request_id": "x", **members}).encode()


MALFORMED_REST = [
    (200, b'{"business_error": {"code": 5}}', "BUSINESS_ERROR"),  # a numeric code, kept as "5"
    (200, b'{"business_error": {"code": true}}', "AGENT_ERROR"),
    (200, b'{"business_error": {"code": "late", "message": 7}}', "AGENT_ERROR"),
    (200, b'{"business_error": {"message": "no code"}}', "AGENT_ERROR"),
    (200, b'{"business_error": [1, 2]}', "AGENT_ERROR"),
    (200, b'{"business_error": 5}', "BUSINESS_ERROR"),
    (200, b'{"business_error": false}', "AGENT_ERROR"),
    (200, b'{"business_error": "out_of_stock"}', "BUSINESS_ERROR"),
    (200, b'{"business_error": {"code": "out_of_stock", "details": [1]}}', "BUSINESS_ERROR"),
    (200, b'{"business_error": null, "ok": true}', None),
    (200, b"not json", "AGENT_ERROR"),
    (200, b'{"truncated": ', "AGENT_ERROR"),
    (200, b'"\xff\xfe"', "AGENT_ERROR"),
    (200, b'{"business_error": "\xff"}', "AGENT_ERROR"),
    (200, b'{"n": 1e999, "business_error": "x"}', "AGENT_ERROR"),
    (200, b"[1, 2, 3]", None),
    (200, b"1" + b"0" * 40, None),
    (200, b"", None),
    (201, b'{"created": true}', None),
    (302, b"", "AGENT_ERROR"),
    (307, b"", "AGENT_ERROR"),
    (500, b'{"business_error": "x"}', "AGENT_ERROR"),
    (503, b"<html>down</html>", "AGENT_ERROR"),
    (429, b"slow down", "BUSY"),
    (400, b"bad", "INVALID_PAYLOAD"),
    (422, b'{"detail": [{"loc": ["body"], "msg": "field required"}]}', "INVALID_PAYLOAD"),
    (413, b"", "PAYLOAD_TOO_LARGE"),
]

MALFORMED_ATP = [
    (200, frame_answer(status="maybe"), "AGENT_ERROR"),
    (200, frame_answer(), "AGENT_ERROR"),
    (200, frame_answer(status=5), "AGENT_ERROR"),
    (200, frame_answer(status="success", business_error={"code": 5}), "BUSINESS_ERROR"),
    (200, frame_answer(status="success", business_error={"code": None}), "AGENT_ERROR"),
    (200, frame_answer(status="success", context_update=[1]), "AGENT_ERROR"),
    (200, frame_answer(error_code=5), "AGENT_ERROR"),
    (200, frame_answer(error_code="NOT_A_CODE", error_message="?"), "AGENT_ERROR"),
    (200, b'{"status": "success", "result": 1e999}', "AGENT_ERROR"),
    (200, b"[1]", "AGENT_ERROR"),
    (200, b"null", "AGENT_ERROR"),
    (200, b"", "AGENT_ERROR"),
    (200, frame_answer(status="success", business_error={"code": "late"}), "BUSINESS_ERROR"),
    (200, frame_answer(status="busy"), "BUSY"),
    (200, frame_answer(status="success", result=[1]), None),
    (500, b"Internal Server Error", "AGENT_ERROR"),
    (400, b"400: Bad Request", "INVALID_PAYLOAD"),
    (431, b"", "INVALID_FRAME"),
    (400, frame_answer(error_code="INVALID_FRAME", error_message="bad frame", can_retry=False), "INVALID_FRAME"),
    (400, frame_answer(error_code="INVALID_PAYLOAD", error_message="bad input", can_retry=False), "INVALID_PAYLOAD"),
]


@pytest.mark.parametrize(("protocol", "table"), [("rest", MALFORMED_REST), ("atp", MALFORMED_ATP)])
async def test_every_answer_however_malformed_is_a_documented_outcome(mesh: Mesh, start_scripted, protocol, table):
    # The table is mostly failures: a breaker that never opens lets every row reach the agent.
    await mesh.put_policy("echo", {"circuit_breaker": {"min_requests": 1000}})
    agent = await start_scripted("odd", protocol)
    agent.headers = {"Location": f"{agent.url}/elsewhere"}
    await mesh.add(agent)
    request_ids = []
    for index, (status, body, expected) in enumerate(table):
        agent.status, agent.body = status, body
        answer = await mesh.call(payload=index, request_id=f"{protocol}-{index}")
        code = answer.body.get("error_code")
        assert code == expected, (status, body, answer.body)
        assert answer.status == (ErrorCode(code).http_status if code else 200), (status, body, answer.body)
        request_ids.append(answer.body["request_id"])
    # Every one of them is a call like any other: traced and counted.
    for request_id in request_ids:
        assert (await mesh.get(f"/traces/{request_id}"))["call"]["request_id"] == request_id
    assert (await mesh.reach_totals())["total"] == len(table)
    # Malformed answers count against the instance; busy answers and refusals of the request do not.
    not_counted = {None, "BUSY", "INVALID_FRAME", "PAYLOAD_TOO_LARGE", "INVALID_PAYLOAD"}
    counted = [expected for _, _, expected in table if expected not in not_counted]
    successes = sum(expected is None for _, _, expected in table)
    assert breaker_counts(mesh)["odd"] == ("closed", len(counted) + successes, len(counted))


async def test_a_json_rpc_batch_with_a_malformed_answer_is_answered_item_by_item(mesh: Mesh, start_agent,
                                                                                 start_scripted):
    odd = await start_scripted("odd")
    odd.body = b'{"business_error": {"code": true}}'
    await mesh.add(odd, "odd")
    await mesh.add(await start_agent("plain"))
    batch = [{"jsonrpc": "2.0", "method": "atp.call", "id": 1, "params": {"capability": "odd", "payload": 1}},
             {"jsonrpc": "2.0", "method": "atp.call", "id": 2, "params": {"capability": "echo", "payload": 2}}]
    answer = await mesh.post(batch)
    assert answer.status == 200
    first, second = answer.body
    assert first["error"]["data"]["error_code"] == "AGENT_ERROR"
    assert second["result"]["result"] == {"echo": 2, "agent": "plain"}


async def test_an_agents_422_is_the_callers_error_and_not_tried_elsewhere(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"circuit_breaker": BREAKER, "retry": {"enabled": True, "max_attempts": 2}})
    strict, other = await start_agent("strict"), await start_agent("other")
    strict.status = other.status = 422
    await mesh.add_all([strict, other], idempotent=True)
    answers = [await mesh.call(payload={"wrong": True}) for _ in range(30)]
    assert {(a.status, a.body["error_code"], a.body["can_retry"], a.route["attempts"]) for a in answers} == \
        {(400, "INVALID_PAYLOAD", False, 1)}
    assert strict.calls + other.calls == 30
    assert {state for state, _, _ in breaker_counts(mesh).values()} == {"closed"}
    assert all(failures == 0 for _, _, failures in breaker_counts(mesh).values())
