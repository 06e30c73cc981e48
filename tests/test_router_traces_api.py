"""GET /traces and /traces/{request_id}: each routed call end to end, nested calls as a tree."""

from __future__ import annotations

import json

from router.core import RouterSettings


async def send(mesh, frame):
    async with mesh.http.post(f"{mesh.url}/atp", json=frame) as response:
        return response.status, await response.json()


async def get(mesh, path):
    async with mesh.http.get(f"{mesh.url}{path}") as response:
        return response.status, await response.json()


async def test_a_call_is_traced_with_its_decision_and_attempts(mesh, start_agent):
    agent = await start_agent("trace-a")
    await mesh.add(agent, "trace.echo")
    status, _answer = await send(mesh, {"request_id": "root-1", "capability": "trace.echo", "payload": {"x": 1}})
    assert status == 200
    status, body = await get(mesh, "/traces/root-1")
    assert status == 200
    call = body["call"]
    assert call["capability"] == "trace.echo" and call["outcome"] == "success"
    # The first hop names the trace: a new id, never the request_id (a caller's choice, maybe another's too).
    assert len(call["trace_id"]) == 32 and call["trace_id"] != "root-1"
    assert call["plan"] == ["trace-a"] and call["policy"] == "least_load"
    assert [a["instance"] for a in call["attempts"]] == ["trace-a"]
    assert call["attempts"][0]["error_code"] is None and call["total_ms"] >= call["attempts"][0]["elapsed_ms"]
    assert call["payload_bytes"] == len(b'{"x":1}')
    # The agent received the trace id, so its own nested calls can join the tree.
    assert json.loads(agent.received[-1].headers["X-Reach-Context"])["trace_id"] == call["trace_id"]
    # Its traceparent names the attempt's span (a child of the call's), so the agent's span hangs under it.
    attempt_span = call["attempts"][0]["span_id"]
    assert agent.received[-1].headers["traceparent"] == f"00-{call['trace_id']}-{attempt_span}-01"
    assert len(attempt_span) == 16 and attempt_span != call["span_id"]


async def test_nested_calls_form_a_tree(mesh, start_agent):
    agent = await start_agent("trace-b")
    await mesh.add(agent, "trace.echo")
    await send(mesh, {"request_id": "parent", "capability": "trace.echo", "payload": {},
                      "context": {"trace_id": "t-1"}})
    for child in ("child-1", "child-2"):
        await send(mesh, {"request_id": child, "capability": "trace.echo", "payload": {},
                          "context": {"trace_id": "t-1", "parent_request_id": "parent"}})
    await send(mesh, {"request_id": "grandchild", "capability": "trace.echo", "payload": {},
                      "context": {"trace_id": "t-1", "parent_request_id": "child-2"}})
    _status, body = await get(mesh, "/traces/grandchild")
    tree = body["tree"]

    def shape(node):
        return node["call"]["request_id"], [shape(kid) for kid in node["children"]]

    assert shape(tree) == ("parent", [("child-1", []), ("child-2", [("grandchild", [])])])


async def test_listing_filters_and_validates(mesh, start_agent):
    agent = await start_agent("trace-c")
    await mesh.add(agent, "trace.echo")
    for n in range(3):
        await send(mesh, {"request_id": f"r{n}", "capability": "trace.echo", "payload": {}})
    await send(mesh, {"request_id": "unknown-cap", "capability": "no.such", "payload": {}})
    status, body = await get(mesh, "/traces?limit=2&capability=trace.echo")
    assert status == 200 and [t["request_id"] for t in body["traces"]] == ["r2", "r1"]
    status, body = await get(mesh, "/traces/unknown-cap")
    assert status == 200 and body["call"]["error_code"] == "UNKNOWN_CAPABILITY"
    for bad in ("0", "abc", "1001"):
        status, body = await get(mesh, f"/traces?limit={bad}")
        assert status == 400 and body["field"] == "limit"
    status, body = await get(mesh, "/traces/never-seen")
    assert status == 404 and body["error"] == "trace_not_found"


async def test_over_the_budget_successes_go_untraced_and_failures_never_do(start_mesh, start_agent):
    mesh = await start_mesh(routing=RouterSettings(traced_successes_per_second=1))
    agent = await start_agent("trace-d")
    await mesh.add(agent, "trace.echo")
    for n in range(6):
        status, _ = await send(mesh, {"request_id": f"s{n}", "capability": "trace.echo", "payload": {}})
        assert status == 200
    agent.status = 500
    status, _ = await send(mesh, {"request_id": "failed-1", "capability": "trace.echo", "payload": {}})
    assert status == 502
    calls = (await get(mesh, "/traces?limit=100"))[1]["traces"]
    successes = [call for call in calls if call["request_id"] != "failed-1"]
    assert "failed-1" in {call["request_id"] for call in calls}
    # One success traced per wall-clock second; six calls milliseconds apart span one or two seconds.
    seconds = [int(call["started_at"]) for call in successes]
    assert len(set(seconds)) == len(seconds) and 1 <= len(successes) < 6
    assert mesh.router.traces.sampled_out == 6 - len(successes)
    assert f"agentreach_router_traces_sampled_out_total {6 - len(successes)}.0" in await mesh.get("/metrics")
