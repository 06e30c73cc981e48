"""Timeouts (connect, first byte, total; the caller's hint), retries and late completions, end to end."""

from __future__ import annotations

import time

import pytest

from conftest import wait_for
from log_support import LogLines
from router_support import Mesh


async def timed_call(mesh: Mesh, **frame):
    started = time.monotonic()
    answer = await mesh.call(payload="slow?", **frame)
    return answer, time.monotonic() - started


# Upper bounds on a timed-out call only catch a deadline that was not kept: the call would then end
# at a later deadline or with the agent's answer (a 200, which the error code rules out). They sit
# seconds past the deadline under test, far beyond anything a loaded machine adds; the lower bounds
# (a deadline is never early) cannot flake.
LATE = 3.0


def timeout_line(logs: LogLines, request_id: str) -> dict:
    [line] = [line for line in logs.named("call timed out") if line["request_id"] == request_id]
    return line


async def test_connect_timeout(mesh: Mesh, slow_connect, router_logs):
    await mesh.put_policy("echo", {"timeout": {"connect_ms": 200, "first_byte_ms": 2000, "total_ms": 3000}})
    await mesh.add(slow_connect, agent_id="unreachable")
    answer, elapsed = await timed_call(mesh)
    assert answer.status == 504
    assert (answer.body["error_code"], answer.body["can_retry"]) == ("CONNECT_TIMEOUT", True)
    assert 0.15 <= elapsed < LATE, elapsed
    line = timeout_line(router_logs, answer.body["request_id"])
    assert (line["instance"], line["timeout"], line["capability"]) == ("unreachable", "CONNECT_TIMEOUT", "echo")


async def test_connect_timeout_fails_over_because_nothing_was_sent(mesh: Mesh, slow_connect, start_agent):
    await mesh.put_policy("echo", {"timeout": {"connect_ms": 150, "total_ms": 3000}})
    alive = await start_agent("alive")
    await mesh.add(slow_connect, agent_id="unreachable", healthy=False)
    await mesh.add(alive, healthy=False)
    await mesh.ready("unreachable")
    await mesh.heartbeat("alive", load=0.5)  # least-load tries the idle-looking unreachable one first
    await mesh.until_state("alive")
    answer, elapsed = await timed_call(mesh)
    assert answer.status == 200 and answer.body["result"]["agent"] == "alive"
    assert answer.route["attempts"] == 2 and answer.route["degraded"] and answer.route["reason"] == "failover"
    assert elapsed >= 0.15
    # The unreachable instance is ejected now: the next call goes straight to the live one.
    answer, elapsed = await timed_call(mesh)
    assert answer.status == 200 and answer.route["attempts"] == 1


@pytest.mark.parametrize(("knob", "timeout", "code", "earliest"), [
    ("first_byte_delay", {"first_byte_ms": 200, "total_ms": 3000}, "FIRST_BYTE_TIMEOUT", 0.18),
    ("body_delay", {"first_byte_ms": 200, "total_ms": 300}, "TOTAL_TIMEOUT", 0.28),  # slow body
])
async def test_first_byte_and_total_timeouts(mesh: Mesh, start_agent, router_logs, knob, timeout, code, earliest):
    await mesh.put_policy("echo", {"timeout": timeout})
    slow = await start_agent("slow")
    setattr(slow, knob, 1.0)
    await mesh.add(slow)
    answer, elapsed = await timed_call(mesh)
    assert answer.status == 504 and answer.body["error_code"] == code
    assert earliest <= elapsed < LATE, elapsed
    assert slow.calls == 1
    line = timeout_line(router_logs, answer.body["request_id"])
    assert (line["instance"], line["timeout"]) == ("slow", code)


@pytest.mark.parametrize("protocol", ["rest", "atp"])
async def test_timeout_hint_shortens_but_never_lengthens(mesh: Mesh, start_agent, protocol):
    await mesh.put_policy("echo", {"timeout": {"total_ms": 800}})
    dribbler = await start_agent("dribbler", protocol)
    dribbler.body_delay = 2.0
    await mesh.add(dribbler)
    shortened, short_elapsed = await timed_call(mesh, timeout_hint=150)
    assert shortened.body["error_code"] == "TOTAL_TIMEOUT" and short_elapsed >= 0.13, short_elapsed
    sent = time.monotonic()
    lengthened, elapsed = await timed_call(mesh, timeout_hint=5000)
    # Not lengthened: the agent's whole answer (2 s) would have been a success. Shortened: ended first.
    assert lengthened.body["error_code"] == "TOTAL_TIMEOUT" and 0.78 <= elapsed < LATE, elapsed
    assert short_elapsed < elapsed
    # The agent is told the budget it really has.
    if protocol == "rest":
        told = [int(received.headers["X-Reach-Timeout-Ms"]) for received in dribbler.received]
    else:
        told = [received.json()["timeout_hint"] for received in dribbler.received]
    # The second is told the capability's 800 ms less the router's time before sending, which lies
    # between the call leaving here and arriving at the agent (less one for the whole milliseconds sent).
    assert told[0] <= 150 and 800 - (dribbler.received[1].arrived - sent) * 1000 - 1 <= told[1] <= 800


async def test_retries_only_for_idempotent_capabilities_with_retry_enabled(mesh: Mesh, start_agent):
    agents = [await start_agent(f"r-{i}") for i in range(3)]
    for agent in agents:
        agent.status = 500
    cases = {"idem.retry": (True, True), "plain.retry": (False, True), "idem.noretry": (True, False)}
    ids = []
    for name, (idempotent, retry) in cases.items():
        await mesh.put_policy(name, {"retry": {"enabled": retry, "max_attempts": 2}})
        for agent in agents:
            ids.append(await mesh.add(agent, name, agent_id=f"{agent.name}-{name}", idempotent=idempotent,
                                      healthy=False))
    await mesh.ready(*ids)

    async def sent(name: str) -> tuple[int, dict]:
        before = sum(agent.calls for agent in agents)
        answer = await mesh.call(name, payload="x")
        assert answer.status == 502 and answer.body["error_code"] == "AGENT_ERROR"
        return sum(agent.calls for agent in agents) - before, answer.route

    calls, route = await sent("idem.retry")
    assert calls == 2 and route["attempts"] == 2  # bounded by max_attempts, though a third instance exists
    for name in ("plain.retry", "idem.noretry"):
        calls, route = await sent(name)
        assert calls == 1 and route["attempts"] == 1, name


async def test_a_retry_that_succeeds_is_degraded_and_business_errors_are_not_retried(mesh: Mesh, start_agent):
    await mesh.put_policy("echo", {"retry": {"enabled": True, "max_attempts": 3}})
    broken, fine = await start_agent("broken"), await start_agent("fine")
    broken.status = 500
    await mesh.add(broken, healthy=False, idempotent=True)
    await mesh.add(fine, healthy=False, idempotent=True)
    await mesh.ready("broken", "fine")
    answers = [await mesh.call(payload=i) for i in range(10)]
    assert all(answer.status == 200 and answer.route["instance"] == "fine" for answer in answers)
    retried = [answer for answer in answers if answer.route["attempts"] == 2]
    assert retried and all(answer.route["degraded"] and answer.route["reason"] == "failover" for answer in retried)
    assert broken.calls == len(retried)
    # A business error is the agent's considered answer: retrying elsewhere would not change it.
    broken.status, fine.business_error = 200, {"code": "NO_SUCH_ORDER", "message": "order 7 does not exist"}
    broken.business_error = fine.business_error
    before = broken.calls + fine.calls
    answer = await mesh.call(payload="order 7")
    assert answer.status == 422 and answer.body["error_code"] == "BUSINESS_ERROR"
    assert answer.body["business_error"] == {"code": "NO_SUCH_ORDER", "message": "order 7 does not exist"}
    assert broken.calls + fine.calls - before == 1


async def test_late_completion_is_logged_as_success_after_response_timeout(mesh: Mesh, start_agent, router_logs):
    await mesh.put_policy("echo", {"timeout": {"first_byte_ms": 100, "total_ms": 2000}})
    late = await start_agent("late")
    late.first_byte_delay = 0.4
    late.report_completion = True
    await mesh.add(late)
    answer = await mesh.call(payload="x")
    assert answer.body["error_code"] == "FIRST_BYTE_TIMEOUT"
    request_id = answer.body["request_id"]
    await wait_for(lambda: late.completions, what="the agent to report its completion")
    assert late.completions == [{"status": 200, "request_id": request_id, "known": True}]
    [line] = router_logs.named("execution_success_but_response_timeout")
    assert (line["request_id"], line["instance"], line["timeout"], line["capability"]) == \
        (request_id, "late", "FIRST_BYTE_TIMEOUT", "echo")
    assert line["finished_ms"] >= 400
    # A completion the router never gave up on, or a malformed note, is not an event.
    async with mesh.http.post(f"{mesh.url}/completions", json={"request_id": "never-timed-out"}) as response:
        assert response.status == 200 and (await response.json())["known"] is False
    async with mesh.http.post(f"{mesh.url}/completions", json={"request": 1}) as response:
        assert response.status == 400
    assert len(router_logs.named("execution_success_but_response_timeout")) == 1
