"""Intent frames through a real router with the real model: route when sure, refuse when not."""

from __future__ import annotations

import pytest

from conftest import wait_for
from router.core import RouterSettings
from router.server import RouterServer, RouterServerSettings
from router_support import Mesh, capability
from semantic.settings import SemanticSettings

CAPABILITIES = {
    "order.query": ("Look up where a customer's order is and its delivery status",
                    ["where is my order", "has my package shipped", "track my delivery"]),
    "order.qps": ("Report the queries per second served by the order service",
                  ["what is the QPS of the order service", "order service request rate"]),
    "weather.forecast": ("Forecast the weather for a city", ["will it rain tomorrow in Paris"]),
}


@pytest.fixture
async def semantic_mesh(start_registry, start_agent, http):
    registry = await start_registry(silence_timeout=60, health_interval=60)
    settings = RouterServerSettings(port=0, routing=RouterSettings(), auth=False,
                                    semantic=SemanticSettings(enabled=True))
    router = RouterServer(settings, hub=registry.hub)
    await router.start()
    mesh = Mesh(registry, router, http)
    agents = {}
    for name, (description, examples) in CAPABILITIES.items():
        agent = await start_agent(name)
        agents[name] = agent
        await mesh.register(name, [capability(name, agent.endpoint, description=description, examples=examples)])
        await mesh.heartbeat(name)
    await wait_for(lambda: router.semantic.index.names == sorted(CAPABILITIES), timeout=10,
                   what="the semantic index to hold every capability")
    for name in CAPABILITIES:
        await mesh.until_state(name)
    yield mesh, agents
    await mesh.close()


async def send(mesh, frame):
    async with mesh.http.post(f"{mesh.url}/atp", json=frame, headers={"X-Reach-Route-Headers": "on"}) as response:
        return response.status, await response.json(), response.headers


async def test_a_clear_intent_is_routed_and_its_score_reported(semantic_mesh):
    mesh, agents = semantic_mesh
    status, body, headers = await send(mesh, {"intent": "can you track where my package is", "payload": {"n": 1}})
    assert status == 200, body
    assert body["route"]["capability"] == "order.query"
    assert body["route"]["match_score"] >= mesh.router_server.semantic.rule.threshold
    assert body["route"]["intent_candidates"][0]["capability"] == "order.query"
    assert float(headers["X-Reach-Match-Score"]) == body["route"]["match_score"]
    assert agents["order.query"].calls == 1 and agents["order.qps"].calls == 0
    async with mesh.http.get(f"{mesh.url}/reach") as response:
        reach = await response.json()
    assert reach["route_decisions"]["semantic"] == 1 and reach["semantic"]["indexed"] == 3


async def test_an_unmatched_intent_is_refused_with_candidates_and_nothing_is_forwarded(semantic_mesh):
    mesh, agents = semantic_mesh
    status, body, _ = await send(mesh, {"intent": "compose a sonnet about autumn leaves", "payload": {}})
    assert status == 422 and body["error_code"] in ("INTENT_UNMATCHED", "INTENT_AMBIGUOUS")
    assert body["can_retry"] is False
    assert len(body["route"]["intent_candidates"]) == 3
    assert sum(agent.calls for agent in agents.values()) == 0


async def test_a_name_always_wins_over_an_intent(semantic_mesh):
    mesh, _agents = semantic_mesh
    status, body, _ = await send(mesh, {"capability": "weather.forecast", "intent": "where is my order",
                                        "payload": {}})
    assert status == 200 and body["route"]["capability"] == "weather.forecast"
    assert "match_score" not in body["route"]


async def test_intent_without_semantic_matching_is_an_invalid_frame(mesh):
    status, body, _ = await send(mesh, {"intent": "where is my order", "payload": {}})
    assert status == 400 and body["error_code"] == "INVALID_FRAME"
    assert "semantic matching is off" in body["error_message"]
