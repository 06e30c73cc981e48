"""Degradation levels through a real registry, router and agents: L0 fails fast (never a pending instance,
and its policy cannot name a way to degrade), L1 degrades and alerts, L2 degrades silently; the fixed answer
is the last floor, marked degraded in route and counted degraded in reach."""

from typing import Any

import pytest

from router_support import Mesh


async def put(mesh: Mesh, body: Any) -> tuple[int, Any]:
    async with mesh.http.put(f"{mesh.registry.url}/policies/echo", json=body, headers=mesh.admin) as answer:
        return answer.status, await answer.json()


@pytest.mark.parametrize(("body", "field"), [
    ({"degradation": {"level": "L0"}, "fallback_capability": "other"}, "fallback_capability"),
    ({"degradation": {"level": "L0", "answer": {"text": "sorry"}}}, "degradation.answer"),
    ({"degradation": {"level": "L0"}, "rules": [{"id": "d", "priority": 1, "action": "degrade"}]}, "rules[0].action"),
    ({"degradation": {"level": "L3"}}, "degradation.level"),
    ({"degradation": {"answer": "x" * 70_000}}, "degradation.answer"),
])
async def test_contradicting_degradation_is_refused(mesh: Mesh, body: dict[str, Any], field: str):
    status, answer = await put(mesh, body)
    assert status == 400 and answer["field"] == field, answer


async def test_l0_never_uses_a_pending_instance_where_l2_does(mesh: Mesh, start_agent: Any):
    agent = await start_agent("pending-1")
    await mesh.add(agent, "echo", healthy=False)
    await mesh.until_state("pending-1", "pending")
    await mesh.put_policy("echo", {"degradation": {"level": "L0"}})
    refused = await mesh.call("echo", {})
    assert refused.status == 503 and refused.body["error_code"] == "NO_ROUTABLE_INSTANCE"
    assert "L0" in refused.body["error_message"] and agent.calls == 0
    await mesh.put_policy("echo", {"degradation": {"level": "L2"}})
    served = await mesh.call("echo", {})
    assert served.status == 200 and served.route["degraded"] is True and agent.calls == 1


async def failing_with_a_floor(mesh: Mesh, start_agent: Any, level: str) -> Any:
    broken = await start_agent("broken-1")
    broken.status = 500
    await mesh.add(broken, "echo")
    await mesh.put_policy("echo", {"degradation": {"level": level, "answer": {"text": "sorry, a person will call"}}})
    return broken


@pytest.mark.parametrize("level", ["L1", "L2"])
async def test_the_fixed_answer_is_the_floor_marked_and_counted_degraded(mesh: Mesh, start_agent: Any, level: str):
    broken = await failing_with_a_floor(mesh, start_agent, level)
    answer = await mesh.call("echo", {})
    assert answer.status == 200 and answer.body["status"] == "success"
    assert answer.body["result"] == {"text": "sorry, a person will call"}
    assert (answer.route["degraded"], answer.route["reason"]) == (True, "fixed_answer")
    assert "instance" not in answer.route and broken.calls == 1
    totals = await mesh.reach_totals("echo")
    assert (totals["total"], totals["degraded"], totals["failed"]) == (1, 1, 0)
    degraded = (await mesh.get("/alerts"))["degraded"]
    if level == "L1":
        assert [(alert["capability"], alert["answers"], alert["last_reason"]) for alert in degraded] == \
            [("echo", 1, "fixed_answer")]
    else:
        assert degraded == []


async def test_l1_alerts_on_a_fallback_too_and_logs_each(mesh: Mesh, start_agent: Any, caplog: Any):
    broken = await start_agent("broken-1")
    broken.status = 500
    await mesh.add(broken, "echo")
    await mesh.add(await start_agent("spare-1"), "spare")
    await mesh.put_policy("echo", {"fallback_capability": "spare", "degradation": {"level": "L1"}})
    for _ in range(3):
        answer = await mesh.call("echo", {})
        assert answer.status == 200 and answer.route["reason"] == "fallback"
    [alert] = (await mesh.get("/alerts"))["degraded"]
    assert (alert["capability"], alert["answers"]) == ("echo", 3)
    assert [record.capability for record in caplog.records if record.getMessage() == "degraded_answer"] == \
        ["echo"] * 3


async def test_a_caller_error_gets_no_floor(mesh: Mesh, start_agent: Any):
    await failing_with_a_floor(mesh, start_agent, "L2")
    answer = await mesh.call("echo", {}, version=">=9")
    assert answer.status == 503 and answer.body["error_code"] == "VERSION_UNSATISFIABLE"
