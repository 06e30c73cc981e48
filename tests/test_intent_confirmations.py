"""Confirmations on their way to the registry: retried when it did not take them, counted, and carrying the
router's rule, which the registry's acceptance check uses (issue 17). Real servers over loopback HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from conftest import call, wait_for
from mesh.examples import Confirmation, HeardRule, loosest
from recording_support import Received, RecordingServer
from registry.server import RegistryServer, RegistrySettings
from router.server import RouterServer, RouterServerSettings
from router_support import capability
from semantic.confirmations import ConfirmationQueue, ConfirmationRefused, report_over_http, worth_retrying
from semantic.matcher import MatchRule
from semantic.settings import SemanticSettings
from test_intent_learning import confirm_weather
from test_semantic_routing import CAPABILITIES
from weblayer.errors import ApiError

FAST = (0.01, 0.01, 0.01)
RULE = MatchRule(threshold=0.45, margin=0.05)
# Labelled to route nowhere; "requests per second right now" as an order.qps example sends it there under
# RULE, but not under the model's own threshold and margin (0.53, 0.075).
SEARCH_QPS = "how many requests per second does the search API get"


class StandIn(RecordingServer):
    """A registry stand-in answering its confirmations with ``statuses`` in turn (the last one from then on)."""

    def __init__(self, *statuses: int):
        super().__init__(self._answer)
        self.statuses = list(statuses)

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return web.json_response({"error": "x", "message": "x"}, status=status) if status >= 400 \
            else web.Response(status=status)


@pytest.fixture
async def stand_ins(http: aiohttp.ClientSession) -> AsyncIterator[Any]:
    started: list[StandIn] = []

    async def start(*statuses: int) -> StandIn:
        server = await StandIn(*statuses).start()
        started.append(server)
        return server
    yield start
    for server in started:
        await server.stop()


def queue_to(http: aiohttp.ClientSession, url: str, rule: MatchRule | None = RULE) -> ConfirmationQueue:
    return ConfirmationQueue(lambda name, confirmation: report_over_http(http, url, None, name, confirmation),
                             rule, retry_delays=FAST)


@pytest.fixture
def running() -> Iterator[Any]:
    tasks: list[asyncio.Task[None]] = []

    def run(queue: ConfirmationQueue) -> ConfirmationQueue:
        tasks.append(asyncio.get_running_loop().create_task(queue.run()))
        return queue
    yield run
    for task in tasks:
        task.cancel()


@pytest.mark.parametrize(("statuses", "outcome", "tries"), [
    ((503, 502, 200), "reported", 3),
    ((429, 204), "reported", 2),
    ((400,), "refused", 1),
    ((404,), "refused", 1),
    ((503,), "given_up", 1 + len(FAST)),
])
async def test_a_confirmation_is_retried_while_the_registry_may_yet_take_it(
        http: aiohttp.ClientSession, stand_ins: Any, running: Any, statuses: tuple[int, ...], outcome: str,
        tries: int) -> None:
    registry = await stand_ins(*statuses)
    queue = running(queue_to(http, registry.url))
    queue.offer("order.qps", "requests per second right now", "caller-1")
    await wait_for(lambda: sum(queue.outcomes.values()) == 1, timeout=5, what="the confirmation to be settled")
    assert dict(queue.outcomes) == {outcome: 1} and queue.retries == tries - 1
    bodies = [received.json() for received in registry.at("/examples/order.qps/confirmations")]
    assert bodies == [{"text": "requests per second right now", "caller": "caller-1", "threshold": 0.45,
                       "margin": 0.05}] * tries


async def test_an_unreachable_registry_is_retried_until_it_listens(http: aiohttp.ClientSession,
                                                                   running: Any) -> None:
    registry = await StandIn(204).start()
    port = registry.port
    await registry.stop()
    queue = running(ConfirmationQueue(lambda name, confirmation: report_over_http(
        http, registry.url, None, name, confirmation), None, retry_delays=(0.05,) * 200))
    queue.offer("order.qps", "qps now", "caller-1")
    await wait_for(lambda: queue.retries >= 1, timeout=5, what="a try to fail")
    await registry.start(port)
    try:
        await wait_for(lambda: queue.outcomes["reported"] == 1, timeout=10, what="a retry to reach it")
        assert [r.json() for r in registry.at("/examples/order.qps/confirmations")] == [
            {"text": "qps now", "caller": "caller-1"}]
    finally:
        await registry.stop()


def test_only_a_refusal_of_what_was_sent_is_final() -> None:
    assert not worth_retrying(ConfirmationRefused(400, b"")) and not worth_retrying(ApiError(409, "full", "x"))
    assert worth_retrying(ConfirmationRefused(503, b"")) and worth_retrying(ConfirmationRefused(429, b""))
    assert worth_retrying(aiohttp.ClientConnectionError()) and worth_retrying(TimeoutError())


def test_the_loosest_rule_heard_is_kept() -> None:
    heard = loosest(None, Confirmation(text="a", caller="c"))
    assert heard is None
    heard = loosest(heard, Confirmation(text="a", caller="c", threshold=0.5, margin=0.02))
    heard = loosest(heard, Confirmation(text="a", caller="c", threshold=0.6, margin=0.01))
    assert heard == HeardRule(0.5, 0.01)


async def test_the_routers_metrics_count_retries_and_outcomes(start_registry: Any, start_agent: Any,
                                                              http: aiohttp.ClientSession, stand_ins: Any) -> None:
    registry = await start_registry()
    flaky = await stand_ins(503, 503, 204)
    router = RouterServer(RouterServerSettings(port=0, auth=False), hub=registry.hub,
                          report_confirmation=lambda name, confirmation: report_over_http(
                              http, flaky.url, None, name, confirmation))
    await router.start()
    try:
        await confirm_weather(http, registry, router, await start_agent("weather"), "umbrella?")
        await wait_for(lambda: len(flaky.received) == 3, timeout=10, what="two retries")

        async def scraped() -> str | None:
            async with http.get(f"{router.url}/metrics") as response:
                text = await response.text()
            return text if 'agentreach_router_confirmations_total{outcome="reported"} 1.0' in text else None
        text = await wait_for(scraped, timeout=5, what="the metric")
        assert "agentreach_router_confirmation_retries_total 2.0" in text
    finally:
        await router.stop()


async def test_acceptance_checks_with_the_routers_rule(tmp_path: Path, start_agent: Any,
                                                       http: aiohttp.ClientSession) -> None:
    evaluation = tmp_path / "intents.json"
    evaluation.write_text(f'[{{"label": null, "lang": "en", "texts": ["{SEARCH_QPS}"]}}]')
    registry = RegistryServer(RegistrySettings(data_dir=tmp_path / "data", port=0, auth=False,
                                               example_evaluation=evaluation))
    await registry.start()
    router = RouterServer(RouterServerSettings(port=0, auth=False, registry_url=registry.url, semantic=SemanticSettings(
        enabled=True, threshold=RULE.threshold, margin=RULE.margin)))
    await router.start()
    try:
        for name, (description, examples) in CAPABILITIES.items():
            agent = await start_agent(name)
            body = {"agent_id": name, "capabilities": [capability(name, agent.endpoint, description=description,
                                                                  examples=examples)]}
            assert (await call(http, "POST", f"{registry.url}/register", None, body))[0] == 200
        await wait_for(lambda: router.mirror.offers("order.qps"), timeout=5, what="the router to see order.qps")
        assert (await call(http, "PUT", f"{registry.url}/examples/order.qps/settings", None,
                           {"auto_accept_at": 1}))[0] == 200
        frame = {"capability": "order.qps", "intent": "requests per second right now", "confirm_intent": True,
                 "payload": {}}
        async with http.post(f"{router.url}/atp", json=frame) as response:
            assert response.status == 200, await response.text()

        async def judged() -> dict[str, Any] | None:
            listed = (await call(http, "GET", f"{registry.url}/examples/order.qps"))[1]
            return next((e for e in listed if e["state"] != "pending"), None)
        example = await wait_for(judged, timeout=30, interval=0.1, what="the registry's judgement")
        assert example["state"] == "rejected" and SEARCH_QPS in example["reason"], example
        # An operator's phrasing is checked with the rule the routers reported too.
        status, body = await call(http, "POST", f"{registry.url}/examples/order.qps", None,
                                  {"text": "requests per second"})
        assert status == 201 and body["state"] == "rejected" and SEARCH_QPS in body["reason"], body
    finally:
        await router.stop()
        await registry.stop()
