"""The registry's HTTP API over real loopback HTTP: registration, queries, ownership."""

from __future__ import annotations

import asyncio

from conftest import post, registration, wait_for


async def test_seed_validation_script_works_as_written(registry, http):
    # The seed article's own bare-HTTP check: register, query, heartbeat.
    status, body = await post(http, f"{registry.url}/register", {
        "agent_id": "demo-agent-01",
        "capabilities": [{"name": "demo.echo", "protocol": "rest", "endpoint": "http://127.0.0.1:9001/echo"}],
        "metadata": {"zone": "test"},
    })
    assert status == 200 and body["state"] == "pending"
    status, body = await post(http, f"{registry.url}/query", {"capability": "demo.echo"})
    assert status == 200
    assert body["capability"] == "demo.echo" and body["service"] == "demo-agent-01"
    assert [i["agent_id"] for i in body["instances"]] == ["demo-agent-01"]
    assert body["instances"][0]["endpoint"] == "http://127.0.0.1:9001/echo"
    status, body = await post(http, f"{registry.url}/heartbeat", {"agent_id": "demo-agent-01", "load": 0.3})
    assert status == 200 and body["state"] == "healthy"
    status, body = await post(http, f"{registry.url}/query", {"capability": "demo.echo"})
    instance = body["instances"][0]
    assert instance["state"] == "healthy" and instance["load"] == 0.3
    assert 0 <= instance["last_heartbeat_ms_ago"] < 5000


async def test_register_answers_the_resolved_record(registry, http):
    status, body = await post(http, f"{registry.url}/register",
                              registration("a1", "intent.detect", base_url="http://127.0.0.1:7000/api/"))
    assert status == 200
    assert body["agent_id"] == "a1" and body["service"] == "a1" and body["state"] == "pending"
    assert body["capabilities"][0]["endpoint"] == "http://127.0.0.1:7000/intent.detect"
    assert body["health_url"] == "http://127.0.0.1:7000/healthz"
    assert body["metadata"]["zone"] == "test"


async def test_agents_listing_and_single_agent(registry, http):
    await post(http, f"{registry.url}/register", registration("a1", "x.one"))
    await post(http, f"{registry.url}/register", registration("a2", "x.two"))
    async with http.get(f"{registry.url}/agents") as response:
        agents = (await response.json())["agents"]
    assert sorted(a["agent_id"] for a in agents) == ["a1", "a2"]
    async with http.get(f"{registry.url}/agents/a2") as response:
        assert response.status == 200
        assert (await response.json())["capabilities"][0]["name"] == "x.two"
    async with http.get(f"{registry.url}/agents/nobody") as response:
        assert response.status == 404
        assert (await response.json())["error"] == "unknown_agent"


async def test_query_orders_healthy_before_pending_before_demoted(start_registry, http):
    registry = await start_registry(silence_timeout=0.4, health_interval=60)
    for agent_id in ("silent", "fresh", "beating"):
        await post(http, f"{registry.url}/register", registration(agent_id, "shared.cap", service="svc"))
    await wait_for(lambda: registry.registry.agent("silent").state == "demoted", what="silent demoted")
    await post(http, f"{registry.url}/register", registration("fresh", "shared.cap", service="svc"))
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "beating", "load": 0.5})
    status, body = await post(http, f"{registry.url}/query", {"capability": "shared.cap"})
    assert status == 200
    assert [(i["agent_id"], i["state"]) for i in body["instances"]] == [
        ("beating", "healthy"), ("fresh", "pending"), ("silent", "demoted")]


async def test_unknown_capability_is_404(registry, http):
    status, body = await post(http, f"{registry.url}/query", {"capability": "no.such"})
    assert status == 404 and body["error"] == "capability_not_found" and body["field"] == "capability"


async def test_heartbeat_from_unknown_agent_is_404(registry, http):
    status, body = await post(http, f"{registry.url}/heartbeat", {"agent_id": "ghost", "load": 0.1})
    assert status == 404 and body["error"] == "unknown_agent"


async def test_another_service_cannot_claim_an_owned_name(registry, http):
    assert (await post(http, f"{registry.url}/register", registration("a1", "order.query", service="orders")))[0] == 200
    status, body = await post(http, f"{registry.url}/register",
                              registration("b1", "billing.pay", "order.query", service="billing"))
    assert status == 409
    assert body["error"] == "capability_owned" and body["owner"] == "orders"
    assert body["capability"] == "order.query" and body["field"] == "capabilities[1].name"
    # Nothing of the refused registration was applied, not even its unowned name.
    status, _ = await post(http, f"{registry.url}/query", {"capability": "billing.pay"})
    assert status == 404


async def test_instances_of_one_service_share_its_capabilities(registry, http):
    for agent_id in ("orders-1", "orders-2"):
        status, _ = await post(http, f"{registry.url}/register",
                               registration(agent_id, "order.query", service="orders"))
        assert status == 200
    _, body = await post(http, f"{registry.url}/query", {"capability": "order.query"})
    assert sorted(i["agent_id"] for i in body["instances"]) == ["orders-1", "orders-2"]


async def test_same_name_twice_in_one_registration_is_400(registry, http):
    status, body = await post(http, f"{registry.url}/register", registration("a1", "dup.cap", "dup.cap"))
    assert status == 400
    assert body["error"] == "duplicate_capability" and body["field"] == "capabilities[1].name"
    assert registry.store.revision == 0


async def test_same_agent_registering_again_updates_its_record(registry, http):
    await post(http, f"{registry.url}/register", registration("a1", "old.cap"))
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.1})
    status, body = await post(http, f"{registry.url}/register", registration("a1", "new.cap"))
    assert status == 200 and [c["name"] for c in body["capabilities"]] == ["new.cap"]
    assert (await post(http, f"{registry.url}/query", {"capability": "old.cap"}))[0] == 404
    assert (await post(http, f"{registry.url}/query", {"capability": "new.cap"}))[0] == 200
    async with http.get(f"{registry.url}/agents") as response:
        assert [a["agent_id"] for a in (await response.json())["agents"]] == ["a1"]


async def test_ownership_is_released_when_the_last_instance_leaves(registry, http):
    await post(http, f"{registry.url}/register", registration("o1", "order.query", service="orders"))
    await post(http, f"{registry.url}/register", registration("o2", "order.query", service="orders"))
    await post(http, f"{registry.url}/deregister", {"agent_id": "o1"})
    status, _ = await post(http, f"{registry.url}/register", registration("t1", "order.query", service="thief"))
    assert status == 409
    status, body = await post(http, f"{registry.url}/deregister", {"agent_id": "o2"})
    assert status == 200 and body["deregistered"] is True
    status, body = await post(http, f"{registry.url}/register", registration("n1", "order.query", service="newco"))
    assert status == 200 and body["service"] == "newco"


async def test_concurrent_claims_by_two_services_have_one_winner(registry, http):
    bodies = [registration(f"agent-{i}", "contested.cap", service=f"service-{i % 2}") for i in range(20)]
    results = await asyncio.gather(*(post(http, f"{registry.url}/register", body) for body in bodies))
    winners = {body["service"] for status, body in results if status == 200}
    losers = [body for status, body in results if status != 200]
    assert len(winners) == 1
    assert all(body["error"] == "capability_owned" for body in losers)
    _, query = await post(http, f"{registry.url}/query", {"capability": "contested.cap"})
    assert {i["agent_id"] for i in query["instances"]} == {
        body["agent_id"] for status, body in results if status == 200}


async def test_deregister_unknown_agent_is_404(registry, http):
    status, body = await post(http, f"{registry.url}/deregister", {"agent_id": "ghost"})
    assert status == 404 and body["error"] == "unknown_agent"


async def test_healthz_and_unknown_route(registry, http):
    async with http.get(f"{registry.url}/healthz") as response:
        assert response.status == 200 and (await response.json())["status"] == "ok"
    async with http.get(f"{registry.url}/nope") as response:
        assert response.status == 404 and (await response.json())["error"] == "not_found"
    async with http.get(f"{registry.url}/register") as response:
        assert response.status == 405 and (await response.json())["error"] == "method_not_allowed"
