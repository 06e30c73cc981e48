"""The audit trail through the real router: one row per call, refusals included, digests not payloads.

A real registry and router with authentication on, the audit trail in a real SQLite file, a real
agent on loopback; rows are read back over `GET /audit` as an operator would.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from agent_support import Agent
from conftest import wait_for
from router.server import RouterServer, RouterServerSettings
from router_support import Mesh


def digest_of(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload)).hexdigest()


async def audit(mesh: Mesh, query: str) -> list[dict[str, Any]]:
    return (await mesh.get(f"/audit?{query}"))["entries"]


async def audited_mesh(start_mesh, start_agent, path: Path) -> tuple[Mesh, Agent]:
    mesh = await start_mesh(auth=True, router_settings={"audit_path": path})
    agent = await start_agent("orders-1")
    await mesh.add(agent, "order.lookup")
    return mesh, agent


async def test_every_call_and_every_refusal_leaves_a_row_with_the_payload_digest(start_mesh, start_agent,
                                                                                tmp_path):
    mesh, _ = await audited_mesh(start_mesh, start_agent, tmp_path / "audit.db")
    reader = await mesh.new_client(["order.*"], name="support-desk")
    outsider = await mesh.new_client(["weather.now"], name="weather-app")
    secret = {"order_id": "A-1001", "card": "4111 1111 1111 1111"}

    ok = await mesh.call("order.lookup", secret, headers={"X-API-Key": reader["api_key"]}, request_id="ok-1",
                         context={"trace_id": "incident-7"})
    assert ok.status == 200, ok.body
    forbidden = await mesh.call("order.lookup", secret, headers={"X-API-Key": outsider["api_key"]},
                                request_id="no-grant-1")
    assert forbidden.status == 403
    anonymous = await mesh.call("order.lookup", secret, request_id="anon-1")
    assert anonymous.status == 401

    rows = {row["request_id"]: row for row in await audit(mesh, "capability=order.lookup")}
    assert set(rows) == {"ok-1", "no-grant-1", "anon-1"}
    assert rows["ok-1"] | {"time": None, "latency_ms": None} == {
        "time": None, "latency_ms": None, "capability": "order.lookup", "request_id": "ok-1", "outcome": "success",
        "caller": reader["client_id"], "caller_name": "support-desk", "instance": "orders-1",
        "trace_id": "incident-7", "parent_request_id": None, "error_code": None,
        "payload_bytes": len(msgspec.json.encode(secret)), "payload_sha256": digest_of(secret),
        "auth_method": "api_key", "rule": None, "chunks": None, "chunk_bytes": None, "input_tokens": None,
        "output_tokens": None, "cost": None}
    assert (rows["no-grant-1"]["outcome"], rows["no-grant-1"]["error_code"], rows["no-grant-1"]["caller"],
            rows["no-grant-1"]["instance"]) == ("refused", "FORBIDDEN", outsider["client_id"], None)
    assert (rows["anon-1"]["outcome"], rows["anon-1"]["error_code"], rows["anon-1"]["caller"]) == \
        ("refused", "UNAUTHENTICATED", None)
    assert all(row["payload_sha256"] == digest_of(secret) for row in rows.values())

    assert [row["request_id"] for row in await audit(mesh, f"caller={reader['client_id']}")] == ["ok-1"]
    assert [row["request_id"] for row in await audit(mesh, "trace_id=incident-7")] == ["ok-1"]
    assert [row["request_id"] for row in await audit(mesh, "request_id=anon-1")] == ["anon-1"]

    stored = b"".join(path.read_bytes() for path in tmp_path.glob("audit.db*"))
    assert b"4111 1111" not in stored and b"A-1001" not in stored, "the payload itself is never stored"


async def test_the_audit_trail_is_for_the_admin_only_and_checks_its_filters(start_mesh, start_agent, tmp_path):
    mesh, _ = await audited_mesh(start_mesh, start_agent, tmp_path / "audit.db")
    client = await mesh.new_client(["order.lookup"])
    for headers in ({}, {"X-API-Key": client["api_key"]}):
        async with mesh.http.get(f"{mesh.url}/audit", headers=headers) as response:
            assert response.status in (401, 403)
            assert (await response.json())["error"] in ("unauthenticated", "forbidden")
    async with mesh.http.get(f"{mesh.url}/audit?limit=0", headers=mesh.admin) as response:
        body = await response.json()
        assert (response.status, body["error"], body["field"]) == (400, "invalid_field", "limit")


async def test_rows_survive_a_router_restart(start_mesh, start_agent, tmp_path):
    path = tmp_path / "audit.db"
    mesh, _ = await audited_mesh(start_mesh, start_agent, path)
    client = await mesh.new_client(["order.lookup"])
    answer = await mesh.call("order.lookup", {"n": 1}, headers={"X-API-Key": client["api_key"]},
                             request_id="before-restart")
    assert answer.status == 200
    await mesh.router_server.stop()

    again = RouterServer(RouterServerSettings(port=0, auth=True, audit_path=path), hub=mesh.registry.hub)
    await again.start()
    try:
        await wait_for(lambda: again.mirror.synced, what="the restarted router to load the registry")
        async with mesh.http.get(f"{again.url}/audit?request_id=before-restart", headers=mesh.admin) as response:
            assert response.status == 200
            [row] = (await response.json())["entries"]
        assert (row["caller"], row["outcome"], row["instance"], row["payload_sha256"]) == \
            (client["client_id"], "success", "orders-1", digest_of({"n": 1}))
    finally:
        await again.stop()
