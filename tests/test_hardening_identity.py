"""An agent_id belongs to one service, as a capability name does (hardening item 9).

Real registries on loopback with auth on: two services, each with its own registration token,
race for agent_ids over real HTTP, and try to take another service's id while its instance is
away (deregistered for a restart, or evicted), across a registry restart too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import admin_key, call, registration, wait_for
from registry.server import RegistryServer

Start = Callable[..., Awaitable[RegistryServer]]


class Services:
    """A registry with auth on and a registration token each for services alpha and beta."""

    def __init__(self, server: RegistryServer, http: aiohttp.ClientSession, tokens: dict[str, str]):
        self.server = server
        self.http = http
        self.tokens = tokens

    async def register(self, service: str, agent_id: str, **extra: Any) -> tuple[int, Any]:
        """Register ``agent_id`` for ``service``, offering ``<service>.work``."""
        return await call(self.http, "POST", f"{self.server.url}/register", self.tokens[service],
                          registration(agent_id, f"{service}.work", **extra))

    async def deregister(self, service: str, agent_id: str) -> None:
        status, body = await call(self.http, "POST", f"{self.server.url}/deregister", self.tokens[service],
                                  {"agent_id": agent_id})
        assert status == 200, body


async def services_on(server: RegistryServer, http: aiohttp.ClientSession) -> Services:
    tokens = {}
    for service in ("alpha", "beta"):
        status, issued = await call(http, "POST", f"{server.url}/tokens", admin_key(server), {"service": service})
        assert status == 201, issued
        tokens[service] = issued["token"]
    return Services(server, http, tokens)


@pytest.fixture
async def services(start_registry: Start, http: aiohttp.ClientSession) -> Services:
    return await services_on(await start_registry(auth=True), http)


def taken(answer: tuple[int, Any], owner: str) -> bool:
    status, body = answer
    return (status, body["error"], body["field"], body["owner"]) == (409, "agent_id_taken", "agent_id", owner)


async def test_two_services_racing_for_a_new_agent_id_one_wins_every_round(services: Services) -> None:
    for round_ in range(40):
        agent_id = f"race-{round_}"
        alpha, beta = await asyncio.gather(services.register("alpha", agent_id), services.register("beta", agent_id))
        assert sorted([alpha[0], beta[0]]) == [200, 409], (round_, alpha, beta)
        winner, loser = ("alpha", beta) if alpha[0] == 200 else ("beta", alpha)
        assert taken(loser, winner), loser
        assert services.server.registry.state.records[agent_id].service == winner


async def test_an_agent_id_cannot_be_taken_while_its_instance_restarts(services: Services) -> None:
    assert (await services.register("alpha", "keep-1"))[0] == 200
    assert taken(await services.register("beta", "keep-1"), "alpha"), "not while it is live"
    await services.deregister("alpha", "keep-1")
    assert taken(await services.register("beta", "keep-1"), "alpha"), "nor between deregister and register"
    assert (await services.register("alpha", "keep-1"))[0] == 200, "the owner comes back"
    await services.deregister("alpha", "keep-1")
    assert (await services.register("alpha", "keep-1"))[0] == 200, "again and again"


async def test_an_evicted_agent_id_stays_its_services_across_a_registry_restart(
        start_registry: Start, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = await start_registry(data_dir=data, auth=True, silence_timeout=0.2, health_interval=0.1,
                                  evict_after=1)
    services = await services_on(server, http)
    # Nothing listens on port 9: the instance never beats, fails its checks and is evicted.
    assert (await services.register("alpha", "gone-1"))[0] == 200
    await services.register("alpha", "left-1")
    await services.deregister("alpha", "left-1")
    await wait_for(lambda: server.registry.state.records["gone-1"].evicted_at is not None, what="gone-1 evicted")
    assert taken(await services.register("beta", "gone-1"), "alpha")

    await server.stop()
    again = await start_registry(data_dir=data, auth=True)
    services = Services(again, http, services.tokens)
    assert taken(await services.register("beta", "gone-1"), "alpha"), "the WAL keeps the evicted record"
    assert taken(await services.register("beta", "left-1"), "alpha"), "and the binding of a deregistered one"
    assert (await services.register("alpha", "gone-1"))[0] == 200
    assert (await services.register("alpha", "left-1"))[0] == 200


async def test_only_the_newest_deregistered_agent_ids_stay_bound(start_registry: Start,
                                                                 http: aiohttp.ClientSession) -> None:
    services = await services_on(await start_registry(auth=True, kept_agent_ids=2), http)
    for agent_id in ("old-1", "mid-1", "new-1"):
        await services.register("alpha", agent_id)
        await services.deregister("alpha", agent_id)
    assert list(services.server.registry.state.bindings) == ["mid-1", "new-1"]
    assert (await services.register("beta", "old-1"))[0] == 200, "the oldest binding was forgotten"
    assert taken(await services.register("beta", "mid-1"), "alpha")


async def test_with_auth_off_the_service_named_in_the_registration_is_held_to_the_same_rule(
        registry: RegistryServer, http: aiohttp.ClientSession) -> None:
    status, _ = await call(http, "POST", f"{registry.url}/register", None, registration("dev-1", "a.x", service="a"))
    assert status == 200
    assert taken(await call(http, "POST", f"{registry.url}/register", None,
                            registration("dev-1", "b.x", service="b")), "a")
    assert registry.registry.state.records["dev-1"].service == "a", "the refused registration changed nothing"
