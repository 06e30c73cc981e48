"""Intent matching that learns (issue 17): confirmed phrasings become examples, reviewed at the registry,
routed by every router once accepted. Real registry, real routers over HTTP, the real default model."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from agentreach.knobs import add_auth_switch, add_registry_knobs, registry_settings
from conftest import admin_key, call, wait_for
from mesh.examples import (
    MAX_EXAMPLES_PER_CAPABILITY,
    MAX_PENDING_PER_CALLER,
    ExampleSettings,
    LearnedExample,
    example_id,
    example_key,
    example_settings_key,
)
from mesh.keyspace import KeySpace
from mesh.records import decode_value, encode_value
from mesh.watch import Put, decode_event, encode_event
from registry.server import RegistryServer, RegistrySettings
from router.server import RouterServer, RouterServerSettings
from router_support import capability
from semantic.settings import SemanticSettings
from test_semantic_routing import CAPABILITIES

# Refused with the declared examples alone; routed to its capability once it is one of its examples.
NEW_PHRASING = "did my stuff leave the warehouse"
OTHER_PHRASING = "the parcel I bought last week, any news?"
UMBRELLA = "do I need an umbrella in Berlin"


class LearningMesh:
    """A registry with auth on, the three capabilities served, and two routers following it over HTTP."""

    def __init__(self, registry: RegistryServer, routers: list[RouterServer], http: aiohttp.ClientSession):
        self.registry, self.routers, self.http = registry, routers, http
        self.key = admin_key(registry)

    async def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await call(self.http, method, f"{self.registry.url}{path}", self.key, body)

    async def examples(self, name: str) -> list[dict[str, Any]]:
        status, body = await self.admin("GET", f"/examples/{name}")
        assert status == 200, body
        return body

    async def example(self, name: str, text: str) -> dict[str, Any] | None:
        return next((e for e in await self.examples(name) if e["text"] == text), None)

    async def client(self, *grants: str, name: str = "caller") -> str:
        status, body = await self.admin("POST", "/clients", {"name": name, "trust_level": "internal",
                                                             "grants": list(grants)})
        assert status == 201, body
        for router in self.routers:
            await wait_for(lambda r=router: r.mirror.auth.client_by_api_key(body["api_key"]) is not None,
                           timeout=5, what="the routers to learn the client")
        return str(body["api_key"])

    async def send(self, router: RouterServer, api_key: str, frame: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.http.post(f"{router.url}/atp", json={"payload": {}, **frame},
                                  headers={"X-API-Key": api_key}) as response:
            return response.status, await response.json()

    async def until_routed(self, router: RouterServer, api_key: str, intent: str, name: str) -> None:
        async def routed() -> bool:
            status, body = await self.send(router, api_key, {"intent": intent})
            return status == 200 and body["route"]["capability"] == name
        await wait_for(routed, timeout=10, interval=0.1, what=f"{intent!r} to route to {name} on {router.url}")


async def confirm_weather(http: aiohttp.ClientSession, registry: RegistryServer, router: RouterServer, agent: Any,
                          intent: str) -> None:
    """Register ``agent`` as weather.forecast (auth off), then confirm ``intent`` meant it through ``router``."""
    body = {"agent_id": "weather", "capabilities": [capability("weather.forecast", agent.endpoint)]}
    assert (await call(http, "POST", f"{registry.url}/register", None, body))[0] == 200
    await wait_for(lambda: router.mirror.offers("weather.forecast"), timeout=5, what="the router to see it")
    frame = {"capability": "weather.forecast", "intent": intent, "confirm_intent": True, "payload": {}}
    async with http.post(f"{router.url}/atp", json=frame) as response:
        assert response.status == 200, await response.text()


@pytest.fixture
async def learning(start_registry: Callable[..., Awaitable[RegistryServer]], start_agent: Any,
                   http: aiohttp.ClientSession) -> AsyncIterator[LearningMesh]:
    registry = await start_registry(silence_timeout=60, health_interval=60, auth=True)
    key = admin_key(registry)
    routers = []
    for _ in range(2):
        router = RouterServer(RouterServerSettings(port=0, registry_url=registry.url, registry_key=key,
                                                   semantic=SemanticSettings(enabled=True)))
        await router.start()
        routers.append(router)
    mesh = LearningMesh(registry, routers, http)
    for name, (description, examples) in CAPABILITIES.items():
        agent = await start_agent(name)
        body = {"agent_id": name, "service": name, "metadata": {},
                "capabilities": [capability(name, agent.endpoint, description=description, examples=examples)]}
        assert (await mesh.admin("POST", "/register", body))[0] == 200
        assert (await mesh.admin("POST", "/heartbeat", {"agent_id": name}))[0] == 200
    for router in routers:
        semantic = router.semantic
        assert semantic is not None
        await wait_for(lambda s=semantic: s.index.names == sorted(CAPABILITIES), timeout=10,
                       what="every router to index the capabilities")
    yield mesh
    for router in routers:
        await router.stop()


async def test_refused_then_confirmed_then_accepted_routes_on_the_other_router(learning: LearningMesh) -> None:
    first, second = learning.routers
    caller = await learning.client("order.query")
    status, refused = await learning.send(first, caller, {"intent": NEW_PHRASING})
    assert status == 422 and "order.query" in [c["capability"] for c in refused["route"]["intent_candidates"]]

    status, body = await learning.send(first, caller, {"intent": NEW_PHRASING, "capability": "order.query",
                                                       "confirm_intent": True})
    assert status == 200 and body["route"]["capability"] == "order.query"
    pending = await wait_for(lambda: learning.example("order.query", NEW_PHRASING), timeout=5,
                             what="the confirmation to reach the registry")
    assert pending == {"id": example_id(NEW_PHRASING), "text": NEW_PHRASING, "state": "pending",
                       "confirmations": 1, "source": "confirmed"}
    # Pending is not accepted: neither router routes the phrasing yet.
    for router in learning.routers:
        assert (await learning.send(router, caller, {"intent": NEW_PHRASING}))[0] == 422

    status, accepted = await learning.admin("POST", f"/examples/order.query/{pending['id']}/accept")
    assert status == 200 and accepted["state"] == "accepted", accepted
    await learning.until_routed(second, caller, NEW_PHRASING, "order.query")
    await learning.until_routed(first, caller, NEW_PHRASING, "order.query")


async def test_a_caller_without_the_grant_cannot_confirm_into_a_capability(learning: LearningMesh) -> None:
    router = learning.routers[0]
    weather_only = await learning.client("weather.forecast", name="weather-only")
    status, body = await learning.send(router, weather_only, {"intent": NEW_PHRASING, "capability": "order.query",
                                                              "confirm_intent": True})
    assert status == 403 and body["error_code"] == "FORBIDDEN"
    # The queue is first in, first out: once the allowed confirmation is stored, the refused one would be too.
    status, _ = await learning.send(router, weather_only, {"intent": UMBRELLA, "capability": "weather.forecast",
                                                           "confirm_intent": True})
    assert status == 200
    await wait_for(lambda: learning.example("weather.forecast", UMBRELLA), timeout=5,
                   what="the allowed confirmation to reach the registry")
    assert await learning.examples("order.query") == []


async def test_a_rejected_example_never_routes_even_when_confirmed_again(learning: LearningMesh) -> None:
    router = learning.routers[0]
    callers = [await learning.client("order.query", name=f"caller-{i}") for i in range(2)]
    confirm = {"intent": NEW_PHRASING, "capability": "order.query", "confirm_intent": True}
    assert (await learning.send(router, callers[0], confirm))[0] == 200
    pending = await wait_for(lambda: learning.example("order.query", NEW_PHRASING), timeout=5, what="pending")
    status, rejected = await learning.admin("POST", f"/examples/order.query/{pending['id']}/reject",
                                            {"reason": "too vague"})
    assert status == 200 and rejected["state"] == "rejected" and rejected["reason"] == "too vague"
    # Even a capability that accepts at the first confirmation keeps it rejected.
    assert (await learning.admin("PUT", "/examples/order.query/settings", {"auto_accept_at": 1}))[0] == 200
    assert (await learning.send(router, callers[1], confirm))[0] == 200

    async def counted_twice() -> bool:
        example = await learning.example("order.query", NEW_PHRASING)
        return example is not None and example["confirmations"] == 2
    await wait_for(counted_twice, timeout=5, what="the second confirmation")
    assert (await learning.example("order.query", NEW_PHRASING) or {})["state"] == "rejected"
    # An accepted example after it proves the routers saw everything before it: the rejected one stays out.
    assert (await learning.admin("POST", "/examples/order.query", {"text": OTHER_PHRASING}))[0] == 201
    for each in learning.routers:
        await learning.until_routed(each, callers[0], OTHER_PHRASING, "order.query")
        status, body = await learning.send(each, callers[0], {"intent": NEW_PHRASING})
        assert status == 422, body


async def test_auto_acceptance_counts_distinct_callers(learning: LearningMesh) -> None:
    router = learning.routers[1]
    assert (await learning.admin("PUT", "/examples/weather.forecast/settings", {"auto_accept_at": 2}))[0] == 200
    first, second = [await learning.client("weather.forecast", name=f"w-{i}") for i in range(2)]
    confirm = {"intent": UMBRELLA, "capability": "weather.forecast", "confirm_intent": True}
    for _ in range(3):
        assert (await learning.send(router, first, confirm))[0] == 200
    assert (await learning.send(router, first, {"intent": OTHER_PHRASING, "capability": "weather.forecast"}))[0] == 200
    # A plain call (no confirm_intent) records nothing; the same caller three times counts once.
    example = await wait_for(lambda: learning.example("weather.forecast", UMBRELLA), timeout=5, what="pending")
    assert example["state"] == "pending" and example["confirmations"] == 1
    assert [e["text"] for e in await learning.examples("weather.forecast")] == [UMBRELLA]
    assert (await learning.send(router, second, confirm))[0] == 200

    async def accepted() -> bool:
        found = await learning.example("weather.forecast", UMBRELLA)
        return found is not None and found["state"] == "accepted" and found["confirmations"] == 2
    # The registry loads its model for the first judgement: seconds on a busy machine.
    await wait_for(accepted, timeout=30, interval=0.1, what="acceptance at the second distinct caller")
    await learning.until_routed(learning.routers[0], first, UMBRELLA, "weather.forecast")


async def test_an_example_that_would_route_wrongly_is_rejected_at_acceptance(learning: LearningMesh) -> None:
    # Already an example of another capability, word for word (spacing and case aside).
    status, body = await learning.admin("POST", "/examples/weather.forecast", {"text": "Where is  my ORDER"})
    assert status == 201 and body["state"] == "rejected" and "'order.query'" in body["reason"], body
    # Still closer to order.query than to the capability it would be an example of.
    status, body = await learning.admin("POST", "/examples/order.qps", {"text": "track my delivery please"})
    assert status == 201 and body["state"] == "rejected", body
    assert body["reason"] == "even with it, 'track my delivery please' would be routed to 'order.query'"
    status, body = await learning.admin("POST", f"/examples/order.qps/{body['id']}/accept")
    assert status == 200 and body["state"] == "rejected"
    status, body = await learning.admin("POST", "/examples/no.such.capability", {"text": "hello"})
    assert status == 201 and body["state"] == "rejected" and "No instance offers" in body["reason"]


@pytest.mark.parametrize(("method", "path", "body", "status", "code", "field"), [
    ("POST", "/examples/order.query", {"text": ""}, 400, "invalid_field", "text"),
    ("POST", "/examples/order.query", {"text": "x" * 1025}, 400, "invalid_field", "text"),
    ("POST", "/examples/order.query", {"text": "ok", "state": "accepted"}, 400, "unknown_field", "state"),
    ("POST", "/examples/order.query", {}, 400, "missing_field", "text"),
    ("POST", "/examples/bad%20name", {"text": "ok"}, 400, "invalid_field", "capability"),
    ("PUT", "/examples/order.query/settings", {"auto_accept_at": 0}, 400, "invalid_field", "auto_accept_at"),
    ("PUT", "/examples/order.query/settings", {"auto_accept_at": 65}, 400, "invalid_field", "auto_accept_at"),
    ("POST", "/examples/order.query/0123456789abcdef/accept", None, 404, "example_not_found", "id"),
    ("POST", "/examples/order.query/0123456789abcdef/reject", {"reason": 5}, 400, "invalid_field", "reason"),
    ("DELETE", "/examples/order.query/0123456789abcdef", None, 404, "example_not_found", "id"),
    ("POST", "/examples/order.query/confirmations", {"text": "hi"}, 400, "missing_field", "caller"),
])
async def test_bad_requests_name_the_field_and_change_nothing(start_registry: Any, http: aiohttp.ClientSession,
                                                              method: str, path: str, body: Any, status: int,
                                                              code: str, field: str) -> None:
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    revision = registry.store.revision
    answer = await call(http, method, f"{registry.url}{path}", key, body)
    assert answer[0] == status and answer[1]["error"] == code and answer[1]["field"] == field, answer
    assert registry.store.revision == revision
    assert (await call(http, "GET", f"{registry.url}/examples/order.query"))[0] == 401  # admin only


async def test_examples_are_bounded_per_capability_and_survive_a_restart(start_registry: Any,
                                                                        http: aiohttp.ClientSession,
                                                                        tmp_path: Any) -> None:
    data_dir = tmp_path / "learned"
    registry = await start_registry(data_dir, auth=True)
    key = admin_key(registry)
    url = f"{registry.url}/examples/order.query"
    for i in range(MAX_EXAMPLES_PER_CAPABILITY):
        assert (await call(http, "POST", f"{url}/confirmations", key, {"text": f"phrasing {i}",
                                                                      "caller": f"c-{i}"}))[0] == 200
    # The same words again, spaced and cased otherwise, count on the same example: no room needed.
    status, again = await call(http, "POST", f"{url}/confirmations", key, {"text": " PHRASING   7", "caller": "d"})
    assert status == 200 and again["text"] == "phrasing 7" and again["confirmations"] == 2
    revision = registry.store.revision
    async with http.post(f"{url}/confirmations", json={"text": "one too many", "caller": "c"},
                         headers={"X-API-Key": key}) as response:
        assert response.status == 204
    status, full = await call(http, "POST", url, key, {"text": "one too many"})
    assert status == 409 and full["error"] == "examples_full" and full["field"] == "text"
    assert registry.store.revision == revision
    status, _ = await call(http, "DELETE", f"{url}/{example_id('phrasing 0')}", key)
    assert status == 200
    status, rejected = await call(http, "POST", f"{url}/{example_id('phrasing 1')}/reject", key)
    assert status == 200 and rejected["reason"] == "rejected by an operator"
    assert (await call(http, "PUT", f"{url}/settings", key, {"auto_accept_at": 3}))[0] == 200
    before = (await call(http, "GET", url, key))[1]
    await registry.stop()

    restarted = await start_registry(data_dir, auth=True)
    after = (await call(http, "GET", f"{restarted.url}/examples/order.query", key))[1]
    assert after == before and len(after) == MAX_EXAMPLES_PER_CAPABILITY - 1
    assert (await call(http, "GET", f"{restarted.url}/examples/order.query/settings", key))[1] == {"auto_accept_at": 3}


@pytest.mark.parametrize("frame", [{"intent": "where is my order", "confirm_intent": True},
                                   {"capability": "echo", "confirm_intent": True}])
async def test_confirm_intent_needs_both_the_intent_and_the_capability(mesh: Any, frame: dict[str, Any]) -> None:
    answer = await mesh.post({"payload": {}, **frame})
    assert answer.status == 400 and answer.body["error_code"] == "INVALID_FRAME", answer.body
    assert answer.body["field"] == "confirm_intent"


async def test_a_router_in_process_reports_confirmations_straight_to_its_registry(
        start_registry: Any, start_agent: Any, http: aiohttp.ClientSession) -> None:
    """As `agentreach up` runs them: no HTTP between the two, auth off (one anonymous caller)."""
    registry = await start_registry()
    assert registry.registry is not None
    router = RouterServer(RouterServerSettings(port=0, auth=False), hub=registry.hub,
                          report_confirmation=registry.registry.examples.confirm)
    await router.start()
    try:
        await confirm_weather(http, registry, router, await start_agent("weather"), UMBRELLA)
        listed = await wait_for(lambda: registry.registry.examples.list("weather.forecast"), timeout=5,
                                what="the confirmation")
        assert [(e.text, e.state, e.confirmations) for e in listed] == [(UMBRELLA, "pending", 1)]
        assert registry.registry.state.keys.examples["weather.forecast"][listed[0].id].confirmed_by == ["anonymous"]
    finally:
        await router.stop()


async def test_an_evaluation_set_given_to_the_registry_guards_acceptance(tmp_path: Any,
                                                                        http: aiohttp.ClientSession) -> None:
    """Only an evaluation set holds phrasings that must route nowhere: the near misses an example pulls in."""
    evaluation = tmp_path / "intents.json"
    evaluation.write_text('[{"label": null, "lang": "en", "texts": ["how many requests per second does the search '
                          'API get"]}]')
    registry = RegistryServer(RegistrySettings(data_dir=tmp_path / "data", port=0, auth=False,
                                               example_evaluation=evaluation))
    await registry.start()
    try:
        for name, (description, examples) in CAPABILITIES.items():
            body = {"agent_id": name, "capabilities": [capability(name, "http://127.0.0.1:9/call",
                                                                  description=description, examples=examples)]}
            assert (await call(http, "POST", f"{registry.url}/register", None, body))[0] == 200
        url = f"{registry.url}/examples/order.qps"
        status, body = await call(http, "POST", url, None, {"text": "how many requests per second"})
        assert status == 201 and body["state"] == "rejected", body
        assert body["reason"] == ("with it, 'how many requests per second does the search API get' (labelled to "
                                  "route nowhere) would be routed to 'order.qps'")
        status, body = await call(http, "POST", url, None, {"text": "order service QPS right now"})
        assert status == 201 and body["state"] == "accepted", body
    finally:
        await registry.stop()


async def test_one_caller_alone_cannot_fill_a_capabilitys_examples(registry: RegistryServer,
                                                                  http: aiohttp.ClientSession) -> None:
    url = f"{registry.url}/examples/order.query/confirmations"
    for i in range(MAX_PENDING_PER_CALLER):
        assert (await call(http, "POST", url, None, {"text": f"junk {i}", "caller": "flooder"}))[0] == 200
    async with http.post(url, json={"text": "one more junk", "caller": "flooder"}) as response:
        assert response.status == 204
    # Another caller's phrasing is kept, and a second caller confirming junk frees the flooder's share.
    assert (await call(http, "POST", url, None, {"text": "where is my parcel", "caller": "someone"}))[0] == 200
    assert (await call(http, "POST", url, None, {"text": "junk 0", "caller": "someone"}))[1]["confirmations"] == 2
    assert (await call(http, "POST", url, None, {"text": "one more junk", "caller": "flooder"}))[0] == 200
    listed = (await call(http, "GET", f"{registry.url}/examples/order.query"))[1]
    assert len(listed) == MAX_PENDING_PER_CALLER + 2


def test_the_registry_takes_its_evaluation_set_from_the_command_line(tmp_path: Any) -> None:
    parser = argparse.ArgumentParser()
    add_registry_knobs(parser)
    add_auth_switch(parser, "auth")
    evaluation = tmp_path / "intents.json"
    evaluation.write_text("[]")
    settings = registry_settings(parser.parse_args(["--example-evaluation", str(evaluation)]), 0, parser)
    assert settings.example_evaluation == evaluation
    with pytest.raises(SystemExit):
        registry_settings(parser.parse_args(["--example-evaluation", str(tmp_path / "missing.json")]), 0, parser)


def test_learned_examples_keep_their_stored_and_feed_layout() -> None:
    """A stored format (the WAL replays these bytes, routers decode these lines): pinned like mesh_contract's."""
    example = LearnedExample(capability="order.query", text="where is my parcel", state="accepted",
                             source="confirmed", confirmed_by=["c-1", "c-2"], created_at=1.5)
    stored = (b"\x86\xaacapability\xaborder.query\xa4text\xb2where is my parcel\xa5state\xa8accepted\xa6source"
              b"\xa9confirmed\xacconfirmed_by\x92\xa3c-1\xa3c-2\xaacreated_at\xcb?\xf8\x00\x00\x00\x00\x00\x00")
    key = example_key("order.query", example_id(example.text))
    assert encode_value(example) == stored and decode_value(key, stored) == example
    assert decode_value(example_settings_key("order.query"), b"\x81\xaeauto_accept_at\x03") == \
        ExampleSettings(auto_accept_at=3)
    line = (b'{"type":"put","revision":7,"key":"' + key.encode() + b'","value":{"capability":"order.query",'
            b'"text":"where is my parcel","state":"accepted","source":"confirmed","confirmed_by":["c-1","c-2"],'
            b'"created_at":1.5}}')
    event = decode_event(line)
    assert event == Put(revision=7, key=key, value=example) and encode_event(event) == line + b"\n"
    keys = KeySpace()
    keys.put(key, example)
    assert keys.examples == {"order.query": {example_id(example.text): example}}
    keys.delete(key)
    assert keys.examples == {}
