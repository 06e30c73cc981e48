"""A2A agents as mesh instances: an a2a-sdk server agent registered as ``protocol: "a2a"`` (endpoint = its card
URL) is health-checked through its card and reached from ATP callers, plain and streaming; its task states and
JSON-RPC errors come back as ATP codes."""

from __future__ import annotations

import asyncio

import pytest
from agent_reach import ReachClient, ReachError
from agent_reach.sse import ChunkFrame

from a2a_support import ScriptedExecutor, a2a_app
from conftest import post, registration
from registry.cluster import SoleNode
from registry.health import HealthChecker
from sdk_support import loopback_socket, run_uvicorn
from stream_support import read_stream


@pytest.fixture
async def scripted():
    """A running a2a-sdk agent: (its executor, its card URL)."""
    executor = ScriptedExecutor()
    sock = loopback_socket()
    port = sock.getsockname()[1]
    async with run_uvicorn(a2a_app(executor, port), sock) as server:
        yield executor, f"http://127.0.0.1:{port}/.well-known/agent-card.json", server


async def register_a2a(mesh, card_url: str, agent_id: str = "scripted-1", name: str = "scripted") -> None:
    body = {"agent_id": agent_id, "service": name, "health_url": card_url,
            "capabilities": [{"name": name, "endpoint": card_url, "protocol": "a2a", "timeout_sla_ms": 5000}]}
    async with mesh.http.post(f"{mesh.registry.url}/register", json=body, headers=mesh.admin) as answer:
        assert answer.status == 200, await answer.text()


@pytest.fixture
async def a2a_mesh(start_mesh, scripted):
    """A mesh whose registry probes every 0.2 s and demotes after 1 s of silence, with the scripted agent
    registered: no heartbeat is ever sent for it, so it stays healthy only by its card answering."""
    mesh = await start_mesh(health_interval=0.2, silence_timeout=1.0, evict_after=1000)
    executor, card_url, server = scripted
    await register_a2a(mesh, card_url)
    await mesh.until_state("scripted-1")
    return mesh, executor, server


async def test_an_atp_call_reaches_the_a2a_agent(a2a_mesh):
    mesh, executor, _ = a2a_mesh
    answer = await mesh.call("scripted", "hello", context={"session_id": "s-1", "tenant": "t"})
    assert answer.status == 200 and answer.body["result"] == "echo: hello", answer.body
    assert answer.route["instance"] == "scripted-1"
    [(said, metadata)] = executor.seen
    assert said == ["hello"] and metadata["context"]["tenant"] == "t" and metadata["timeout_hint"] > 0
    async with ReachClient(mesh.url) as client:
        assert await client.call("scripted", {"payload": [1, 2]}) == "echo: {'payload': [1.0, 2.0]}"


async def test_a_streamed_atp_call_gets_each_artifact_update_as_a_chunk(a2a_mesh, http):
    mesh, _, _ = a2a_mesh
    streamed = await read_stream(http, f"{mesh.url}/atp", {"capability": "scripted", "payload": {"count": 3}})
    assert streamed.status == 200 and [chunk["data"] for chunk in streamed.chunks] == [0, 1, 2]
    name, final = streamed.final
    assert name == "response" and final["status"] == "success" and final["result"] == 2
    async with ReachClient(mesh.url) as client:
        items = [item async for item in client.stream("scripted", {"count": 2})]
    assert [item.data for item in items if isinstance(item, ChunkFrame)] == [0, 1] and items[-1].result == 1
    # Not streamed, the same agent's answer is its artifacts together.
    assert (await mesh.call("scripted", {"count": 3})).body["result"] == [0, 1, 2]


@pytest.mark.parametrize(("command", "status", "code", "business"), [
    ("fail", 502, "AGENT_ERROR", None),
    ("ask", 422, "BUSINESS_ERROR", "A2A_INPUT_REQUIRED"),
])
async def test_task_states_become_atp_codes(a2a_mesh, command, status, code, business):
    mesh, _, _ = a2a_mesh
    answer = await mesh.call("scripted", command)
    assert (answer.status, answer.body["error_code"]) == (status, code), answer.body
    if business is not None:
        assert answer.body["business_error"]["code"] == business
    assert "it broke" in answer.body["error_message"] if command == "fail" else "which one?" in \
        answer.body["error_message"]


async def test_a_caller_leaving_a_stream_cancels_the_agents_task(a2a_mesh, http):
    """The a2a-sdk's server works on when its reader leaves: the router sends CancelTask."""
    mesh, executor, _ = a2a_mesh
    async with http.post(f"{mesh.url}/atp", json={"capability": "scripted", "payload": "hold", "stream": True}) \
            as answer:
        assert b"started" in await answer.content.readuntil(b"\n\n")
    await asyncio.wait_for(executor.cancelled.wait(), 1)


async def test_the_registry_checks_the_agent_through_its_card(a2a_mesh):
    mesh, _, server = a2a_mesh
    server.should_exit = True
    await mesh.until_state("scripted-1", "demoted")
    answer = await mesh.call("scripted", "anyone?")
    assert answer.body["error_code"] in ("AGENT_ERROR", "NO_ROUTABLE_INSTANCE"), answer.body


async def test_a_card_naming_no_endpoint_fails_over_as_unsent(start_mesh, http, scripted):
    mesh = await start_mesh()
    _, card_url, _ = scripted
    await register_a2a(mesh, card_url.replace("agent-card.json", "missing.json"), agent_id="nocard-1", name="nocard")
    await mesh.heartbeat("nocard-1")
    await mesh.until_state("nocard-1")
    answer = await mesh.call("nocard", "x")
    assert answer.body["error_code"] == "AGENT_ERROR" and "card answered HTTP 404" in answer.body["error_message"]
    with pytest.raises(ReachError):
        async with ReachClient(mesh.url) as client:
            await client.call("nocard", "x")


async def test_a_sweep_probes_an_a2a_instance_before_it_goes_silent_and_that_is_its_heartbeat(start_registry, http,
                                                                                                scripted):
    """An instance that heartbeats is probed only once demoted; an A2A one, which cannot, at every sweep."""
    registry = await start_registry(health_interval=3600, silence_timeout=30)
    _, card_url, _ = scripted
    body = {"agent_id": "a2a-1", "service": "a2a", "health_url": card_url,
            "capabilities": [{"name": "a2a.cap", "endpoint": card_url, "protocol": "a2a"}]}
    assert (await post(http, f"{registry.url}/register", body))[0] == 200
    assert (await post(http, f"{registry.url}/register", registration("rest-1", "rest.cap",
                                                                      health_url=card_url)))[0] == 200
    checker = HealthChecker(registry.registry, http, SoleNode(registry.registry, None, url=""))
    await checker.sweep()
    assert checker.checks["pass"] == 1
    assert (registry.registry.agent("a2a-1").state, registry.registry.agent("rest-1").state) == ("healthy", "pending")
