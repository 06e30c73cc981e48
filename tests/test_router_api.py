"""POST /atp end to end: frames, what agents receive, route facts, JSON-RPC 2.0, bad input."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import pytest
from agent_reach.atp import ErrorCode

from doc_support import ROOT, doc_mesh, promised_codes
from router_support import Mesh

CONTEXT = {"session_id": "s-1", "user_id": "u-7", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
           "token_budget": 500, "locale": "fr-CA", "custom": {"nested": [1, 2, {"deep": True}]}}


async def test_a_rest_agent_gets_the_payload_and_the_context_in_headers(mesh: Mesh, start_agent):
    agent = await start_agent("rest-1")
    await mesh.add(agent)
    payload = {"text": "héllo", "n": [1, 2, 3]}
    started = time.monotonic()
    answer = await mesh.call(payload=payload, context=CONTEXT, request_id="req-42")
    waited_ms = (time.monotonic() - started) * 1000
    assert answer.status == 200
    [received] = agent.received
    assert received.json() == payload
    assert received.headers["X-Request-Id"] == "req-42"
    assert json.loads(received.headers["X-Reach-Context"]) == CONTEXT
    assert re.fullmatch(r"00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01", received.headers["traceparent"])
    assert received.headers["X-Reach-Completion-Url"] == f"{mesh.url}/completions"
    assert answer.body == {"request_id": "req-42", "status": "success",
                           "result": {"echo": payload, "agent": "rest-1"}, "route": answer.route}
    route = answer.route
    assert {key: route[key] for key in ("instance", "policy", "attempts", "timeout_sla_ms", "capability")} == \
        {"instance": "rest-1", "policy": "least_load", "attempts": 1, "timeout_sla_ms": 5000, "capability": "echo"}
    assert "degraded" not in route  # defaults are omitted: absent means false
    assert 0 <= route["overhead_ms"] <= waited_ms  # the router's own share of what the caller waited
    assert answer.headers["X-Request-Id"] == "req-42"
    assert not [name for name in answer.headers if name.startswith("X-Reach-")], "route headers only when asked"


async def test_the_route_facts_come_as_headers_too_when_asked(mesh: Mesh, start_agent):
    await mesh.add(await start_agent("rest-h"))
    answer = await mesh.call(payload={"n": 1}, request_id="req-h", headers={"X-Reach-Route-Headers": "on"})
    headers = answer.headers
    assert (headers["X-Request-Id"], headers["X-Reach-Instance"], headers["X-Reach-Policy"]) == \
        ("req-h", "rest-h", "least_load")
    assert (headers["X-Reach-Attempts"], headers["X-Reach-Degraded"], headers["X-Reach-Timeout-Sla-Ms"]) == \
        ("1", "false", "5000")
    assert headers["X-Reach-Capability"] == "echo"
    assert float(headers["X-Reach-Overhead-Ms"]) == answer.route["overhead_ms"]


async def test_request_id_is_generated_and_any_trace_id_becomes_a_w3c_trace(mesh: Mesh, start_agent):
    agent = await start_agent("rest-2")
    await mesh.add(agent)
    first = await mesh.call(payload=1, context={"trace_id": "order-flow-17"})
    second = await mesh.call(payload=2, context={"trace_id": "order-flow-17"})
    request_id = first.body["request_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id) and request_id != second.body["request_id"]
    assert agent.received[0].headers["X-Request-Id"] == request_id == first.headers["X-Request-Id"]
    traces = [received.headers["traceparent"].split("-")[1] for received in agent.received]
    assert traces[0] == traces[1] and re.fullmatch(r"[0-9a-f]{32}", traces[0])


async def test_an_atp_agent_gets_the_whole_frame(mesh: Mesh, start_agent):
    agent = await start_agent("atp-1", "atp")
    await mesh.add(agent)
    started = time.monotonic()
    answer = await mesh.call(payload={"q": "x"}, context=CONTEXT, request_id="req-atp", timeout_hint=2500)
    [received] = agent.received
    frame = received.json()
    # The hint the agent gets is the budget left when the router sends: the caller's 2500 ms less
    # the router's own time, which lies between the call leaving here and arriving at the agent (less
    # one for the whole milliseconds sent).
    assert 2500 - (received.arrived - started) * 1000 - 1 <= frame.pop("timeout_hint") <= 2500
    assert frame == {"request_id": "req-atp", "capability": "echo", "payload": {"q": "x"},
                             "context": CONTEXT}
    assert received.headers["X-Request-Id"] == "req-atp" and "traceparent" in received.headers
    assert answer.status == 200 and answer.body["status"] == "success"
    assert answer.body["result"] == {"echo": {"q": "x"}, "agent": "atp-1"}
    assert answer.body["context_update"] == {"served_by": "atp-1"}
    # An ATP agent's error frame keeps its code; its HTTP status comes from the table.
    agent.status = 500
    failed = await mesh.call(payload={"q": "y"})
    assert failed.status == 502 and failed.body["error_code"] == "AGENT_ERROR"
    assert failed.body["error_message"] == "atp-1 answers 500"


async def rpc(mesh: Mesh, body) -> tuple[int, object]:
    answer = await mesh.post(body)
    return answer.status, answer.body


async def test_jsonrpc_single_call_and_ids_preserved(mesh: Mesh, start_agent):
    agent = await start_agent("rpc-1")
    await mesh.add(agent)
    status, body = await rpc(mesh, {"jsonrpc": "2.0", "method": "atp.call", "id": 7,
                                    "params": {"capability": "echo", "payload": {"a": 1}, "context": CONTEXT}})
    assert status == 200 and body["jsonrpc"] == "2.0" and body["id"] == 7
    # The id is echoed, never the call's request_id (the router's own, or the params' request_id).
    assert body["result"]["request_id"] not in ("7", None) and body["result"]["result"]["echo"] == {"a": 1}
    assert body["result"]["status"] == "success"
    assert body["result"]["route"]["instance"] == "rpc-1"
    assert agent.received[0].headers["X-Request-Id"] == body["result"]["request_id"]
    status, body = await rpc(mesh, {"jsonrpc": "2.0", "method": "atp.call", "id": "call-abc",
                                    "params": {"capability": "echo", "payload": 2, "request_id": "req-abc"}})
    assert body["id"] == "call-abc" and body["result"]["request_id"] == "req-abc"
    # An ATP failure is a JSON-RPC error -32000 carrying the error frame whole.
    status, body = await rpc(mesh, {"jsonrpc": "2.0", "method": "atp.call", "id": 8,
                                    "params": {"capability": "nobody.offers.this"}})
    assert status == 200 and body["id"] == 8 and body["error"]["code"] == -32000
    assert body["error"]["data"]["error_code"] == "UNKNOWN_CAPABILITY" and body["error"]["data"]["request_id"] != "8"


async def test_jsonrpc_batches_and_notifications(mesh: Mesh, start_agent):
    agent = await start_agent("rpc-2")
    await mesh.add(agent)
    batch = [
        {"jsonrpc": "2.0", "method": "atp.call", "id": "a", "params": {"capability": "echo", "payload": "A"}},
        {"jsonrpc": "2.0", "method": "atp.call", "params": {"capability": "echo", "payload": "notified"}},
        {"jsonrpc": "2.0", "method": "atp.ping", "id": 3},
        "not an object",
        {"jsonrpc": "2.0", "method": "atp.call", "id": 5, "params": ["wrong"]},
        {"jsonrpc": "2.0", "method": "atp.call", "id": "b", "params": {"capability": "echo", "payload": "B"}},
    ]
    status, body = await rpc(mesh, batch)
    assert status == 200 and isinstance(body, list) and len(body) == 5  # no answer for the notification
    by_id = {(answer["id"], answer.get("error", {}).get("code")): answer for answer in body}
    assert by_id[("a", None)]["result"]["result"]["echo"] == "A"
    assert by_id[("b", None)]["result"]["result"]["echo"] == "B"
    assert set(by_id) == {("a", None), ("b", None), (3, -32601), (None, -32600), (5, -32602)}
    assert sorted(received.json() for received in agent.received) == ["A", "B", "notified"]
    # A lone notification is run and answered with nothing at all.
    answer = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "params": {"capability": "echo", "payload": 9}})
    assert (answer.status, answer.body) == (204, None) and agent.calls == 4
    # A batch of notifications only: nothing either.
    answer = await mesh.post([{"jsonrpc": "2.0", "method": "atp.call", "params": {"capability": "echo"}}])
    assert (answer.status, answer.body) == (204, None) and agent.calls == 5


@pytest.mark.parametrize(("raw", "code", "answer_id"), [
    (b'{"jsonrpc": "2.0", "method": "atp.call", "id": 1, "params": {', -32700, None),
    (b'[{"jsonrpc": "2.0", "method": "atp.call"', -32700, None),
    (b'[]', -32600, None),
    (b'{"jsonrpc": "1.0", "method": "atp.call", "id": 1}', -32600, 1),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600, 1),
    (b'{"jsonrpc": "2.0", "method": "atp.call", "id": {"x": 1}}', -32600, None),
    (b'{"jsonrpc": "2.0", "method": "atp.cast", "id": 2, "params": {}}', -32601, 2),
    (b'{"jsonrpc": "2.0", "method": "atp.call", "id": 3, "params": "echo"}', -32602, 3),
    (b'{"jsonrpc": "2.0", "method": "atp.call", "id": 4, "params": {"capability": 5}}', -32602, 4),
    (b'{"jsonrpc": "2.0", "method": "atp.call", "id": 5, "params": {"payload": 1}}', -32602, 5),
])
async def test_jsonrpc_errors(mesh: Mesh, start_agent, raw, code, answer_id):
    agent = await start_agent("rpc-3")
    await mesh.add(agent)
    answer = await mesh.post(None, raw=raw)
    assert answer.status == 200
    assert answer.body["jsonrpc"] == "2.0" and answer.body["id"] == answer_id
    assert answer.body["error"]["code"] == code and answer.body["error"]["message"]
    if code == -32602 and b'"params": {' in raw:
        assert answer.body["error"]["data"]["error_code"] == "INVALID_FRAME"
    assert agent.calls == 0
    assert (await mesh.call(payload="still serving")).status == 200


BAD_FRAMES = [
    (b'{"capability": "echo", "payload": ', 400, "INVALID_FRAME"),
    (b'"just a string"', 400, "INVALID_FRAME"),
    (b"42", 400, "INVALID_FRAME"),
    (b"null", 400, "INVALID_FRAME"),
    (b'{"payload": {"no": "capability"}}', 400, "INVALID_FRAME"),
    (b'{"capability": "", "payload": 1}', 400, "INVALID_FRAME"),
    (b'{"capability": 5}', 400, "INVALID_FRAME"),
    (b'{"capability": "echo", "context": "not an object"}', 400, "INVALID_FRAME"),
    (b'{"capability": "echo", "timeout_hint": "soon"}', 400, "INVALID_FRAME"),
    (b'{"capability": "echo", "timeout_hint": -5}', 400, "INVALID_FRAME"),
    (b'{"capability": "echo", "request_id": 12}', 400, "INVALID_FRAME"),
    (b'{"capability": "echo", "payload": "' + b"x" * 300 + b'"}', 413, "PAYLOAD_TOO_LARGE"),
    (b'{"capability": "no.such.capability", "payload": 1}', 404, "UNKNOWN_CAPABILITY"),
    (b'{"capability": "echo", "context": {"routing_hint": {"zone": "mars"}}}', 503, "ROUTING_HINT_UNSATISFIABLE"),
]


@pytest.mark.parametrize(("raw", "status", "code"), BAD_FRAMES)
async def test_bad_input_is_an_error_frame_and_nothing_is_forwarded(start_mesh, start_agent, raw, status, code):
    mesh: Mesh = await start_mesh(max_body=4096)
    agent = await start_agent("guarded")
    await mesh.add(agent, max_payload_bytes=256)
    answer = await mesh.post(None, raw=raw)
    assert answer.status == status
    frame = answer.body
    assert set(frame) >= {"request_id", "error_code", "error_message", "can_retry"}
    assert (frame["error_code"], frame["can_retry"]) == (code, ErrorCode(code).can_retry)
    assert frame["request_id"] and frame["error_message"]
    assert answer.headers["X-Request-Id"] == frame["request_id"]
    assert agent.calls == 0
    assert (await mesh.call(payload="still serving")).status == 200


async def test_an_invalid_frame_keeps_the_callers_request_id_and_oversize_bodies_are_refused(start_mesh):
    mesh: Mesh = await start_mesh(max_body=4096)
    answer = await mesh.post({"request_id": "mine", "capability": "echo", "context": []})
    assert answer.status == 400 and answer.body["request_id"] == "mine"
    answer = await mesh.post(None, raw=b'{"capability": "echo", "payload": "' + b"x" * 5000 + b'"}')
    assert answer.status == 413 and answer.body["error_code"] == "PAYLOAD_TOO_LARGE"
    async with mesh.http.get(f"{mesh.url}/atp") as response:
        assert response.status == 405 and (await response.json())["error"] == "method_not_allowed"


async def test_healthz_reports_the_registry_view(mesh: Mesh, start_agent):
    await mesh.add(await start_agent("hz"))
    health = await mesh.get("/healthz")
    assert health["status"] == "ok" and health["registry_synced"] is True
    assert health["capabilities"] == 1 and health["revision"] == mesh.registry.store.revision



# --- docs/atp.md: the error table and the curl examples ----------------------------------------

DOC = ROOT / "docs" / "atp.md"


def test_the_error_table_in_the_docs_is_the_protocols():
    text = DOC.read_text()
    table = text.split("<!-- error-table:start -->")[1].split("<!-- error-table:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        code, status, can_retry, meaning = [cell.strip() for cell in line.strip("|").split("|")]
        rows[code.strip("`")] = (int(status), {"true": True, "false": False}[can_retry])
        assert meaning
    assert rows == {code.value: (code.http_status, code.can_retry) for code in ErrorCode}


def doc_examples() -> list[tuple[str, int, str]]:
    """(command, expected HTTP status, expected output) for every curl block followed by its answer."""
    pattern = re.compile(r"```bash\n(curl [^`]*?)\n```\s*```http\nHTTP/1\.1 (\d{3})([^`]*?)```", re.S)
    return [(command, int(status), shown) for command, status, shown in pattern.findall(DOC.read_text())]


async def test_the_doc_examples_run_as_pasted_against_agentreach_up(http, tmp_path):
    examples = doc_examples()
    assert len(examples) >= 20 and {status for _, status, _ in examples} >= {200, 204, 400, 404, 413, 503}
    async with doc_mesh(http, ROOT, "--data-dir", str(tmp_path / "data"), "--auth", "off") as mesh:
        for example, status, shown in examples:
            pasted = mesh.on_our_ports(example)
            result = await asyncio.to_thread(subprocess.run, ["bash", "-c", pasted], capture_output=True,
                                             text=True, timeout=30)
            got = result.stdout.splitlines()[0] if result.stdout else result.stderr
            assert got.startswith(f"HTTP/1.1 {status} "), f"{example}\n-> {result.stdout}{result.stderr}"
            for promised in promised_codes(shown):
                assert promised in result.stdout, f"{example}\n-> {result.stdout}"
