"""A rest agent's answer means the same outcome whether the router forwarded the call or the SDK reached
the agent directly (the router down, direct fallback): one reading of HTTP statuses and business errors."""

from __future__ import annotations

from typing import Any

from agent_reach import ReachClient
from agent_reach.atp import ErrorFrame, RequestFrame, ResponseFrame

from sdk_support import refused_url

STATUSES = (400, 413, 414, 422, 429, 431, 500, 503)
BUSINESS_ERRORS: tuple[Any, ...] = ("out_of_stock", {"code": "out_of_stock", "message": "none left"}, 5)


def outcome(frame: ResponseFrame | ErrorFrame) -> tuple[Any, ...]:
    if isinstance(frame, ErrorFrame):
        return frame.error_code, frame.can_retry, frame.business_error.code if frame.business_error else None
    if frame.business_error is not None:
        return "BUSINESS_ERROR", False, frame.business_error.code
    return "success", None, None


async def test_router_and_direct_fallback_read_a_rest_agents_answers_alike(registry, start_mesh, start_agent, http):
    agent = await start_agent("plain-1")
    body = {"agent_id": agent.name, "service": "echo", "direct_fallback": True, "capabilities": [
        {"name": "echo", "endpoint": agent.endpoint, "protocol": "rest", "timeout_sla_ms": 5000}]}
    async with http.post(f"{registry.url}/register", json=body) as response:
        assert response.status == 200, await response.text()
    async with http.post(f"{registry.url}/heartbeat", json={"agent_id": agent.name}) as response:
        assert response.status == 200, await response.text()
    mesh = await start_mesh(registry=registry)
    await mesh.until_state(agent.name)
    async with ReachClient(refused_url(), direct_fallback=True,
                           registry_url=registry.url) as direct:
        async def both() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            routed = await mesh.call("echo", 1)
            reached = await direct.send(RequestFrame(capability="echo", payload=1))
            assert reached.route is not None and reached.route.reason == "direct_fallback"
            return routed.body["error_code"] if routed.status != 200 else "success", outcome(reached)

        for status in STATUSES:
            agent.status = status
            routed, reached = await both()
            assert reached[0] == routed, f"HTTP {status}: router {routed}, direct {reached}"
        agent.status = 200
        for business_error in BUSINESS_ERRORS:
            agent.business_error = business_error
            routed, reached = await both()
            assert reached[0] == routed, f"business_error {business_error!r}: router {routed}, direct {reached}"
