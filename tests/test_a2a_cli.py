"""`agentreach a2a add URL --service S`: an a2a-sdk agent registered from its card in one command, with a
registration token (auth on), then reached through the router; a URL with no card is refused and nothing
is registered."""

from __future__ import annotations

import json

import pytest

from a2a_support import ScriptedExecutor, a2a_app
from conftest import wait_for
from router.server import RouterServer, RouterServerSettings
from sdk_support import issue_token, loopback_socket, run_uvicorn
from test_cli_security import agentreach


@pytest.fixture
async def card_url():
    sock = loopback_socket()
    port = sock.getsockname()[1]
    async with run_uvicorn(a2a_app(ScriptedExecutor(), port, name="Scripted Agent"), sock):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def secured(start_registry):
    """A registry with auth on probing every 0.2 s (an A2A agent is healthy by its card), a router following it."""
    registry = await start_registry(auth=True, health_interval=0.2, silence_timeout=1.0, evict_after=1000)
    router = RouterServer(RouterServerSettings(port=0, auth=False), hub=registry.hub)
    await router.start()
    yield registry, router
    await router.stop()


async def test_an_a2a_agent_joins_from_its_card_in_one_command(secured, card_url, http):
    registry, router = secured
    token = (await issue_token(http, registry.url, registry.new_admin_key, "scripted"))["token"]
    result = await agentreach("a2a", "add", card_url, "--service", "scripted", "--registry", registry.url,
                              "--token", token, "--data-dir", "/nonexistent")
    assert result.returncode == 0, result.stderr
    added = json.loads(result.stdout)
    assert (added["capability"], added["agent"], added["endpoint"]) == ("scripted", "Scripted Agent",
                                                                       f"{card_url}/rpc")
    view = registry.registry.agent(added["agent_id"])
    assert view.service == "scripted"
    [capability] = view.capabilities
    assert (capability.protocol, capability.endpoint, capability.description) == \
        ("a2a", f"{card_url}/.well-known/agent-card.json", "A scripted A2A agent")
    mirror = router.mirror
    await wait_for(lambda: (state := mirror.states.get(added["agent_id"])) is not None and state.state == "healthy",
                   what="the router to see the A2A agent healthy through its card")
    async with http.post(f"{router.url}/atp", json={"capability": "scripted", "payload": "hi"}) as answer:
        assert (await answer.json())["result"] == "echo: hi"


async def test_a_url_without_a_card_is_refused_and_nothing_registered(secured, http):
    registry, _ = secured
    token = (await issue_token(http, registry.url, registry.new_admin_key, "nothing"))["token"]
    result = await agentreach("a2a", "add", f"{registry.url}/nowhere", "--service", "nothing", "--registry",
                              registry.url, "--token", token)
    assert result.returncode == 1 and "card answered HTTP 404" in result.stderr and result.stdout == ""
    assert registry.registry.state.records == {}
