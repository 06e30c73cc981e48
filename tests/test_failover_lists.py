"""Failover lists (issue 13 point 3): a caller names several routers, a router several registries,
an SDK agent several registries; each uses one and moves to the next only when it cannot connect.

Everything is real on 127.0.0.1; a "dead" URL is a free port with nothing listening.
"""

from __future__ import annotations

import asyncio

import pytest
from agent_reach import ErrorCode, ReachClient, ReachError, SyncReachClient, error_frame
from aiohttp import web

from conftest import wait_for
from recording_support import RecordingServer
from router.server import RouterServer, RouterServerSettings
from sdk_support import refused_url, wait_state


async def follower(registry_urls: str, teardown) -> RouterServer:
    """A router following the registries over HTTP, as `agentreach router --registry URL,URL` runs it."""
    router = RouterServer(RouterServerSettings(port=0, auth=False, registry_url=registry_urls))
    await router.start()
    teardown.push_async_callback(router.stop)
    await wait_for(lambda: router.mirror.synced, timeout=10, what="the router to load the registry")
    return router


async def test_calls_move_to_the_next_router_when_one_stops(start_mesh, start_agent, teardown):
    mesh = await start_mesh(follow="http")
    await mesh.add(await start_agent("echo-1"))
    second = await follower(mesh.registry.url, teardown)
    await wait_for(lambda: second.mirror.offers("echo"), what="the second router to see echo-1")
    outcomes: list[str] = []
    async with ReachClient([mesh.url, second.url]) as client:
        async def steady_calls() -> None:
            """One call after another; each one's outcome is the router that answered or its error code."""
            while outcomes.count(second.url) < 5 and len(outcomes) < 200:
                try:
                    await client.call("echo", {"n": len(outcomes)}, timeout=5)
                    outcomes.append(client.router_url)
                except ReachError as exc:
                    outcomes.append(exc.error_code)

        calling = asyncio.create_task(steady_calls())
        await wait_for(lambda: len(outcomes) >= 5, what="five calls through the first router")
        await mesh.router_server.stop()
        await calling
    assert outcomes[:5] == [mesh.url] * 5
    # A stopped router refuses connections: those calls never left, so none is lost to CONNECT_TIMEOUT.
    assert ErrorCode.CONNECT_TIMEOUT not in outcomes
    assert set(outcomes) <= {mesh.url, second.url, ErrorCode.AGENT_ERROR}
    assert outcomes[-5:] == [second.url] * 5


async def test_a_call_that_reached_a_router_is_reported_not_sent_again(stand_in_router, start_mesh, start_agent):
    async def fail(frame, request):
        return 500, error_frame(frame.request_id, ErrorCode.AGENT_ERROR, "went wrong mid-call")

    failing = await stand_in_router(fail)
    mesh = await start_mesh()
    echo = await start_agent("echo-1")
    await mesh.add(echo)
    async with ReachClient(f"{failing.url},{mesh.url}") as client:
        with pytest.raises(ReachError) as failure:
            await client.call("echo", {"n": 1}, timeout=5)
    assert failure.value.error_code == ErrorCode.AGENT_ERROR
    assert len(failing.frames) == 1
    assert echo.calls == 0


async def test_sync_client_skips_a_dead_router(start_mesh, start_agent):
    mesh = await start_mesh()
    await mesh.add(await start_agent("echo-1"))
    dead = refused_url()

    def script():
        with SyncReachClient([dead, mesh.url]) as client:
            return client.call("echo", {"n": 7}, timeout=5), client.last_route.instance

    assert await asyncio.to_thread(script) == ({"echo": {"n": 7}, "agent": "echo-1"}, "echo-1")


async def test_router_follows_the_live_registry_of_a_list(start_registry, start_agent, teardown, http):
    registry = await start_registry()
    router = await follower(f"{refused_url()},{registry.url}", teardown)
    assert router.registries is not None and router.registries.current == registry.url
    echo = await start_agent("echo-1")
    body = {"agent_id": "echo-1", "service": "echo", "metadata": {},
            "capabilities": [{"name": "echo", "endpoint": echo.endpoint, "protocol": "rest", "timeout_sla_ms": 5000}]}
    async with http.post(f"{registry.url}/register", json=body) as response:
        assert response.status == 200
    await wait_for(lambda: router.mirror.offers("echo"), what="the router to see echo-1")


async def test_sdk_agent_registers_and_heartbeats_to_the_live_registry(registry, make_agent, http):
    dead = refused_url()
    agent = make_agent("fo-1", [dead, registry.url])

    @agent.capability("test.echo")
    async def echo(payload, ctx):
        return payload

    await agent.start()
    await wait_state(http, registry.url, "fo-1", "healthy")
    assert agent.link is not None
    beats = agent.link.beats
    await wait_for(lambda: agent.link.beats >= beats + 2, what="two more heartbeats")
    assert agent.link.registries.current == registry.url


async def test_router_moves_to_the_next_registry_and_resets_from_it(start_registry, tmp_path, teardown, http):
    """Two embedded registries share nothing: the second does not know the first's revision, so the
    router's resume from it becomes a reset to the second's view (with a shared store it resumes)."""
    first = await start_registry(data_dir=tmp_path / "first")
    second = await start_registry(data_dir=tmp_path / "second")
    for agent_id in ("echo-1", "echo-2"):
        body = {"agent_id": agent_id, "service": "echo", "metadata": {}, "capabilities": [
            {"name": "echo", "endpoint": "http://127.0.0.1:1/call", "protocol": "rest", "timeout_sla_ms": 5000}]}
        async with http.post(f"{first.url}/register", json=body) as response:
            assert response.status == 200
    router = await follower(f"{first.url},{second.url}", teardown)
    await wait_for(lambda: router.mirror.offers("echo"), what="the router to see the first registry's agents")
    await first.stop()
    await wait_for(lambda: router.mirror.offers("echo") is None, what="the router to reset to the second registry")
    assert router.registries is not None and router.registries.current == second.url
    assert router.mirror.revision == second.registry.store.revision


async def test_sdk_agent_moves_past_a_registry_that_answers_5xx(registry, make_agent, teardown, http):
    """A node cut off from etcd (or without quorum) answers 503 to registrations another node takes."""
    async def refuse(request, received):
        return web.json_response({"error": "storage_unavailable", "message": "no quorum", "field": None}, status=503)

    refusing = await RecordingServer(refuse).start()
    teardown.push_async_callback(refusing.stop)
    agent = make_agent("fo-5xx", [refusing.url, registry.url])

    @agent.capability("test.echo")
    async def echo(payload, ctx):
        return payload

    await agent.start()
    await wait_state(http, registry.url, "fo-5xx", "healthy")
    assert agent.link is not None and agent.link.registries.current == registry.url
    assert [received.path for received in refusing.received][:1] == ["/register"]
