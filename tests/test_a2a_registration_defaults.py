"""An A2A instance registered by hand: probed through its card unless told otherwise, and never sent an
ATP frame by a client's direct fallback (its endpoint is a card, only the router speaks A2A to it)."""

from __future__ import annotations

import pytest
from agent_reach import ReachClient, ReachError
from aiohttp import web

from conftest import post
from recording_support import Received, RecordingServer


def a2a_registration(card_url: str) -> dict[str, object]:
    return {"agent_id": "a2a-hand", "service": "a2a-svc", "direct_fallback": True,
            "capabilities": [{"name": "a2a.hand", "protocol": "a2a", "endpoint": card_url}]}


async def test_an_a2a_instance_is_probed_through_its_card_by_default(registry, http):
    card_url = "http://127.0.0.1:9/.well-known/agent-card.json"
    assert (await post(http, f"{registry.url}/register", a2a_registration(card_url)))[0] == 200
    async with http.get(f"{registry.url}/agents/a2a-hand") as response:
        assert (await response.json())["health_url"] == card_url


async def test_direct_fallback_never_posts_atp_to_an_a2a_card(registry, http, teardown):
    async def card(request: web.Request, received: Received) -> web.Response:
        return web.json_response({"name": "card"})

    agent = await RecordingServer(card).start()
    teardown.push_async_callback(agent.stop)
    card_url = f"{agent.url}/.well-known/agent-card.json"
    assert (await post(http, f"{registry.url}/register", a2a_registration(card_url)))[0] == 200
    dead_router = "http://127.0.0.1:9"
    async with ReachClient(dead_router, direct_fallback=True, registry_url=registry.url) as client:
        with pytest.raises(ReachError):
            await client.call("a2a.hand", {"q": 1})
    assert [received.method for received in agent.received] == []
