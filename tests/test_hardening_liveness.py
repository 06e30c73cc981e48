"""A freshly registered instance is routed as a plain success once it beats (hardening item 19).

A real registry, a real router following it in process (as `agentreach up` runs them) and real
SDK agents on 127.0.0.1. The SDK heartbeats as soon as it has registered; once the registry has
answered that heartbeat, the very next call through the router must not be degraded. An
instance that has registered but not yet beaten is routed degraded, and the route says
"pending", not "demoted".
"""

from __future__ import annotations

from typing import Any

from agent_reach import AgentReachSDK, ReachClient

from agent_support import Agent
from conftest import wait_for
from router_support import Mesh


def echo_agent(make: Any, agent_id: str, mesh: Mesh) -> AgentReachSDK:
    # One heartbeat only within a test: the first, sent right after registering.
    agent = make(agent_id, mesh.registry.url, heartbeat_interval=60.0)

    @agent.capability("fresh.echo")
    async def echo(payload: Any, ctx: Any) -> Any:
        return payload

    return agent


async def first_beat_answered(agent: AgentReachSDK) -> None:
    await wait_for(lambda: agent.link is not None and agent.link.beats >= 1, what="the first heartbeat answered")


async def route_of_one_call(mesh: Mesh, payload: str) -> tuple[str | None, bool, str | None]:
    """(instance, degraded, reason) of one successful fresh.echo call through the router."""
    async with ReachClient(mesh.url) as client:
        assert await client.call("fresh.echo", payload) == payload
        route = client.last_route
    return route.instance, route.degraded, route.reason


async def test_the_first_call_after_the_first_heartbeat_is_a_plain_success(mesh: Mesh, make_agent: Any) -> None:
    agent = echo_agent(make_agent, "fresh-1", mesh)
    await agent.start()
    await first_beat_answered(agent)
    assert await route_of_one_call(mesh, "hi") == ("fresh-1", False, None)


async def test_an_instance_registering_again_is_a_plain_success_after_its_first_heartbeat(
        mesh: Mesh, make_agent: Any) -> None:
    first = echo_agent(make_agent, "again-1", mesh)
    await first.start()
    await mesh.until_state("again-1")
    # The process dies without deregistering and a new one starts under the same agent_id.
    await first.link.register()
    await first.link.beat()
    assert await route_of_one_call(mesh, "again") == ("again-1", False, None)


async def test_a_registered_instance_not_yet_heard_from_is_routed_degraded_as_pending(
        mesh: Mesh, start_agent: Any) -> None:
    agent: Agent = await start_agent("quiet-1")
    await mesh.add(agent, "quiet.echo", healthy=False)
    await wait_for(lambda: "quiet-1" in mesh.router.mirror.instances, what="the router to learn of quiet-1")
    answer = await mesh.call("quiet.echo", "x")
    assert answer.status == 200 and answer.body["status"] == "success"
    assert (answer.route["instance"], answer.route["degraded"], answer.route["reason"]) == ("quiet-1", True, "pending")
    assert mesh.router.decisions["pending"] == 1 and mesh.router.decisions["demoted"] == 0
