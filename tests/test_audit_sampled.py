"""The audit row of a call whose trace was sampled out holds what a traced call's row holds.

Under load only some plain successes keep a trace (TraceStore), while every call keeps its audit row;
the row is built from the call's facts, not from the trace. A real registry and router with
authentication on and one success traced a second, the audit trail in a real SQLite file, a real agent
on loopback; rows are read back over `GET /audit`.
"""

from __future__ import annotations

import hashlib

import msgspec

from router.core import RouterSettings


async def test_sampled_out_calls_keep_full_audit_rows(start_mesh, start_agent, tmp_path):
    mesh = await start_mesh(auth=True, routing=RouterSettings(traced_successes_per_second=1),
                            router_settings={"audit_path": tmp_path / "audit.db"})
    agent = await start_agent("orders-1")
    await mesh.add(agent, "order.lookup")
    client = await mesh.new_client(["order.*"], name="support-desk")
    payload = {"order_id": "A-1001"}
    for n in range(6):
        answer = await mesh.call("order.lookup", payload, headers={"X-API-Key": client["api_key"]},
                                 request_id=f"s{n}", context={"trace_id": "incident-9", "parent_request_id": "root-1"})
        assert answer.status == 200, answer.body
    # One success traced per wall-clock second; six calls milliseconds apart span one or two seconds.
    assert mesh.router.traces.sampled_out >= 4

    rows = {row["request_id"]: row for row in (await mesh.get("/audit?trace_id=incident-9"))["entries"]}
    assert set(rows) == {f"s{n}" for n in range(6)}
    for request_id, row in rows.items():
        assert row["latency_ms"] > 0 and row["time"] > 0
        assert row | {"time": None, "latency_ms": None} == {
            "time": None, "latency_ms": None, "capability": "order.lookup", "request_id": request_id,
            "outcome": "success", "caller": client["client_id"], "caller_name": "support-desk",
            "instance": "orders-1", "trace_id": "incident-9", "parent_request_id": "root-1", "error_code": None,
            "payload_bytes": len(msgspec.json.encode(payload)),
            "payload_sha256": hashlib.sha256(msgspec.json.encode(payload)).hexdigest(), "auth_method": "api_key",
            "rule": None, "chunks": None, "chunk_bytes": None, "input_tokens": None, "output_tokens": None,
            "cost": None}
