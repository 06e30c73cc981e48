"""Hardening: every call audited whatever its end, traces that follow the caller's W3C trace, and
caller-chosen ids (JSON-RPC ids, request_ids, trace ids) that never merge two callers' traces.

A real registry and router, real agents on loopback that record the headers they receive; audit
rows and traces are read back over `GET /audit` and `GET /traces` as an operator would.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_reach.atp import RequestFrame

from agent_support import Agent
from conftest import wait_for
from router.forward import Forwarder
from router.tracecontext import MAX_TRACESTATE, parent_span
from router_support import Mesh

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


class FailingForwarder(Forwarder):
    """Forwards for real, then fails as a bug in the router would: the agent saw the call."""

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        await super().send(*args, **kwargs)
        raise RuntimeError("a bug in the router")


async def audited(start_mesh, start_agent, path: Path, *, auth: bool = False) -> tuple[Mesh, Agent]:
    mesh = await start_mesh(auth=auth, router_settings={"audit_path": path})
    agent = await start_agent("trace-agent")
    await mesh.add(agent, "echo")
    return mesh, agent


async def audit_rows(mesh: Mesh, query: str) -> list[dict[str, Any]]:
    return (await mesh.get(f"/audit?{query}"))["entries"]


def shape(node: dict[str, Any]) -> tuple[Any, ...]:
    """A tree as (request_id, caller, children), what tells two callers' trees apart."""
    call = node["call"]
    return call["request_id"], call["caller"], [shape(kid) for kid in node["children"]]


def received_traceparent(agent: Agent) -> tuple[str, str, str, str]:
    version, trace, span, flags = agent.received[-1].headers["traceparent"].split("-")
    return version, trace, span, flags


# Item 7: no call ends unrecorded.

async def test_a_call_that_fails_inside_the_router_is_answered_audited_and_traced(start_mesh, start_agent,
                                                                                  tmp_path, http):
    mesh, agent = await audited(start_mesh, start_agent, tmp_path / "audit.db")
    mesh.router.forwarder = FailingForwarder(http)

    answer = await mesh.call("echo", {"n": 1}, request_id="blew-up")
    assert agent.calls == 1, "the agent was sent the call before the router failed"
    assert answer.status == 500 and answer.body["request_id"] == "blew-up"
    assert answer.body["error_code"] == "INTERNAL_ERROR" and "router" in answer.body["error_message"]
    rpc = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "id": 3,
                           "params": {"capability": "echo", "request_id": "blew-up-rpc"}})
    assert rpc.status == 200 and rpc.body["id"] == 3 and rpc.body["error"]["data"]["error_code"] == "INTERNAL_ERROR"

    for request_id in ("blew-up", "blew-up-rpc"):
        [row] = await audit_rows(mesh, f"request_id={request_id}")
        assert (row["outcome"], row["error_code"], row["capability"]) == ("failed", "INTERNAL_ERROR", "echo")
        assert row["instance"] == "trace-agent", "the audit row names the agent the call reached"
        trace = (await mesh.get(f"/traces/{request_id}"))["call"]
        assert (trace["outcome"], trace["error_code"]) == ("failed", "INTERNAL_ERROR")
    assert (await mesh.reach_totals())["failed_by_code"] == {"INTERNAL_ERROR": 2}


class FailingMatcher:
    """An intent matcher with a bug: the call fails before any capability is chosen."""

    async def resolve(self, intent: str) -> Any:
        raise RuntimeError("a bug in the matcher")


async def test_a_failure_before_a_capability_is_chosen_is_audited_and_counts_for_no_capability(
        start_mesh, start_agent, tmp_path):
    mesh, _ = await audited(start_mesh, start_agent, tmp_path / "audit.db")
    mesh.router.semantic = FailingMatcher()
    answer = await mesh.post({"intent": "say it back", "request_id": "matcher-bug"})
    assert answer.status == 500 and answer.body["error_code"] == "INTERNAL_ERROR"
    [row] = await audit_rows(mesh, "request_id=matcher-bug")
    assert (row["outcome"], row["error_code"], row["capability"]) == ("failed", "INTERNAL_ERROR", "")
    assert mesh.router.ledger.capabilities() == [], "no capability label is invented"


async def test_a_cancelled_call_is_audited_and_traced(start_mesh, start_agent, tmp_path):
    mesh, agent = await audited(start_mesh, start_agent, tmp_path / "audit.db")
    agent.gate = asyncio.Event()
    call = asyncio.create_task(mesh.router.call(RequestFrame(capability="echo", request_id="gone", payload=1)))
    await wait_for(lambda: agent.calls == 1, timeout=5, what="the agent to hold the call")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call

    [row] = await audit_rows(mesh, "request_id=gone")
    assert (row["outcome"], row["error_code"], row["instance"]) == ("failed", "CANCELLED", "trace-agent")
    trace = (await mesh.get("/traces/gone"))["call"]
    assert trace["error_code"] == "CANCELLED" and [a["instance"] for a in trace["attempts"]] == ["trace-agent"]


async def test_calls_refused_before_routing_are_audited_too(start_mesh, start_agent, tmp_path):
    mesh, _ = await audited(start_mesh, start_agent, tmp_path / "audit.db")
    answer = await mesh.post({"intent": "say it back", "request_id": "no-capability"})
    assert answer.status == 400 and answer.body["error_code"] == "INVALID_FRAME"
    [row] = await audit_rows(mesh, "request_id=no-capability")
    assert (row["outcome"], row["error_code"]) == ("failed", "INVALID_FRAME")
    assert (await mesh.get("/traces/no-capability"))["call"]["error_code"] == "INVALID_FRAME"


# Item 15: the caller's W3C trace is continued.

async def test_a_caller_traceparent_is_continued_with_the_router_and_its_attempt_as_child_spans(mesh, start_agent):
    agent = await start_agent("w3c")
    await mesh.add(agent, "echo")
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    answer = await mesh.call("echo", {}, request_id="w3c-1", headers={"traceparent": TRACEPARENT, "tracestate": state})
    assert answer.status == 200, answer.body

    version, trace, span, flags = received_traceparent(agent)
    assert (version, trace, flags) == ("00", CALLER_TRACE, "01")
    assert span != CALLER_SPAN and len(span) == 16 and span.strip("0")
    assert agent.received[-1].headers["tracestate"] == state
    assert json.loads(agent.received[-1].headers["X-Reach-Context"])["trace_id"] == CALLER_TRACE
    call = (await mesh.get("/traces/w3c-1"))["call"]
    # The agent's parent is its attempt's span, itself a child of the router's span of the call.
    assert (call["trace_id"], call["parent_span_id"]) == (CALLER_TRACE, CALLER_SPAN)
    assert call["attempts"][0]["span_id"] == span != call["span_id"]

    await mesh.call("echo", {}, request_id="w3c-2", headers={"traceparent": TRACEPARENT})
    assert received_traceparent(agent)[2] not in (span, CALLER_SPAN), "every call is a new span"
    assert "tracestate" not in agent.received[-1].headers


async def test_the_sampled_flag_and_a_frame_trace_id_are_kept(mesh, start_agent):
    agent = await start_agent("w3c-flags")
    await mesh.add(agent, "echo")
    await mesh.call("echo", {}, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"})
    assert received_traceparent(agent)[1::2] == (CALLER_TRACE, "00")

    # The frame's own trace_id wins; a traceparent of another trace is then not the parent.
    other = "a" * 32
    await mesh.call("echo", {}, request_id="framed", context={"trace_id": other},
                    headers={"traceparent": TRACEPARENT, "tracestate": "k=v"})
    assert received_traceparent(agent)[1] == other and "tracestate" not in agent.received[-1].headers
    call = (await mesh.get("/traces/framed"))["call"]
    assert (call["trace_id"], call["parent_span_id"]) == (other, None)


@pytest.mark.parametrize("header", [
    f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01",  # uppercase hex
    f"01-{CALLER_TRACE}-{CALLER_SPAN}-01",  # a version this router does not speak
    f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01",  # the forbidden version
    f"00-{'0' * 32}-{CALLER_SPAN}-01",  # all-zero trace id
    f"00-{CALLER_TRACE}-{'0' * 16}-01",  # all-zero parent id
    f"00-{CALLER_TRACE[:-1]}-{CALLER_SPAN}-01",  # short trace id
    f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra",  # trailing fields on version 00
    f"00_{CALLER_TRACE}_{CALLER_SPAN}_01",
    "garbage",
])
async def test_an_invalid_traceparent_is_ignored_not_an_error(mesh, start_agent, header):
    agent = await start_agent("w3c-bad")
    await mesh.add(agent, "echo")
    answer = await mesh.call("echo", {}, request_id="bad-tp", headers={"traceparent": header, "tracestate": "k=v"})
    assert answer.status == 200, answer.body
    trace = received_traceparent(agent)[1]
    assert trace != CALLER_TRACE and trace.strip("0")
    assert "tracestate" not in agent.received[-1].headers
    assert (await mesh.get("/traces/bad-tp"))["call"]["parent_span_id"] is None


def test_tracestate_is_forwarded_only_when_bounded_and_printable():
    assert parent_span(TRACEPARENT, "a" * MAX_TRACESTATE).tracestate == "a" * MAX_TRACESTATE
    assert parent_span(TRACEPARENT, "a" * (MAX_TRACESTATE + 1)).tracestate is None
    assert parent_span(TRACEPARENT, "k=\x7fv").tracestate is None
    assert parent_span(TRACEPARENT, "  ").tracestate is None
    assert parent_span(f" {TRACEPARENT}\t", "").span_id == CALLER_SPAN  # optional whitespace


async def test_calls_without_a_trace_get_a_fresh_one_of_their_own(mesh, start_agent):
    agent = await start_agent("fresh")
    await mesh.add(agent, "echo")
    for _ in range(2):
        await mesh.call("echo", {}, request_id="same-id")
    first, second = (json.loads(r.headers["X-Reach-Context"])["trace_id"] for r in agent.received)
    assert first != second and "same-id" not in (first, second)
    assert [r.headers["traceparent"].split("-")[1] for r in agent.received] == [first, second]


# Item 16: caller-chosen ids are the caller's, never the call's identity across callers.

async def two_clients(mesh: Mesh) -> tuple[dict[str, str], dict[str, str]]:
    first = await mesh.new_client(["echo"], name="first-app")
    second = await mesh.new_client(["echo"], name="second-app")
    return {"X-API-Key": first["api_key"]}, {"X-API-Key": second["api_key"]}


async def test_jsonrpc_ids_are_echoed_never_the_request_id(start_mesh, start_agent, tmp_path):
    mesh, agent = await audited(start_mesh, start_agent, tmp_path / "audit.db", auth=True)
    first, second = await two_clients(mesh)
    answers = []
    for headers in (first, second):
        rpc = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "id": 1,
                               "params": {"capability": "echo", "payload": 1}}, headers=headers)
        assert rpc.status == 200 and rpc.body["id"] == 1, rpc.body
        answers.append(rpc.body["result"])
    request_ids = [a["request_id"] for a in answers]
    assert len(set(request_ids)) == 2 and "1" not in request_ids
    assert [r.headers["X-Request-Id"] for r in agent.received] == request_ids
    traces = [(await mesh.get(f"/traces/{rid}"))["tree"] for rid in request_ids]
    assert traces[0]["call"]["trace_id"] != traces[1]["call"]["trace_id"]
    assert all(tree["children"] == [] for tree in traces)
    assert [row["request_id"] for row in await audit_rows(mesh, "capability=echo")] == request_ids[::-1]

    # A request_id in params is the caller's choice, kept; the id is still only echoed.
    rpc = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "id": "x",
                           "params": {"capability": "echo", "request_id": "mine-1"}}, headers=first)
    assert rpc.body["id"] == "x" and rpc.body["result"]["request_id"] == "mine-1"


async def test_the_same_request_id_and_trace_from_two_callers_make_two_trees(start_mesh, start_agent, tmp_path):
    mesh, agent = await audited(start_mesh, start_agent, tmp_path / "audit.db", auth=True)
    first, second = await two_clients(mesh)
    callers = {}
    for name, headers in (("first", first), ("second", second)):
        for context in ({}, {"trace_id": "shared"}):
            suffix = "-shared" if context else ""
            answer = await mesh.call("echo", {}, headers=headers, request_id=f"dup{suffix}", context=context)
            assert answer.status == 200, answer.body
            trace = json.loads(agent.received[-1].headers["X-Reach-Context"])["trace_id"]
            await mesh.call("echo", {}, headers=headers, request_id=f"{name}-kid{suffix}",
                            context={"trace_id": trace, "parent_request_id": f"dup{suffix}"})
        callers[name] = (await mesh.get(f"/traces/{name}-kid"))["call"]["caller"]

    for suffix in ("", "-shared"):
        for name in ("first", "second"):
            tree = (await mesh.get(f"/traces/{name}-kid{suffix}"))["tree"]
            assert shape(tree) == (f"dup{suffix}", callers[name], [(f"{name}-kid{suffix}", callers[name], [])])
    assert len(await audit_rows(mesh, "request_id=dup")) == 2, "both calls are audited, one row each"


async def test_an_agent_calling_under_its_own_identity_still_joins_the_tree(start_mesh, start_agent, tmp_path):
    mesh, agent = await audited(start_mesh, start_agent, tmp_path / "audit.db", auth=True)
    first, second = await two_clients(mesh)
    await mesh.call("echo", {}, headers=first, request_id="root")
    trace = json.loads(agent.received[-1].headers["X-Reach-Context"])["trace_id"]
    # The agent's nested call, made with its own credentials (here: the second client's).
    await mesh.call("echo", {}, headers=second, request_id="nested",
                    context={"trace_id": trace, "parent_request_id": "root"})
    # Another caller naming the parent without knowing the router-made trace id stays apart.
    await mesh.call("echo", {}, headers=second, request_id="stranger", context={"parent_request_id": "root"})
    tree = (await mesh.get("/traces/nested"))["tree"]
    assert [shape(tree)[0], [kid[0] for kid in shape(tree)[2]]] == ["root", ["nested"]]
    assert shape((await mesh.get("/traces/stranger"))["tree"])[0::2] == ("stranger", [])


async def test_a_fallback_call_is_traced_with_every_attempt_in_order(mesh, start_agent):
    primary, backup = await start_agent("primary-1"), await start_agent("backup-1")
    primary.status = 500
    await mesh.add(primary, "echo")
    await mesh.add(backup, "echo.backup")
    await mesh.put_policy("echo", {"fallback_capability": "echo.backup"})
    answer = await mesh.call("echo", {}, request_id="fell-back")
    assert answer.status == 200 and answer.route["reason"] == "fallback"
    attempts = (await mesh.get("/traces/fell-back"))["call"]["attempts"]
    assert [(a["instance"], a["error_code"]) for a in attempts] == [("primary-1", "AGENT_ERROR"), ("backup-1", None)]
