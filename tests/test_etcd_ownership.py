"""Two registries on one etcd race to give one name to two services: exactly one wins, every time."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from conftest import post, registration, wait_for
from registry.server import RegistryServer

ROUNDS = 20


async def race(http: aiohttp.ClientSession, servers: list[RegistryServer],
               bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """Both registrations at once, one to each registry, over real HTTP."""
    return list(await asyncio.gather(*(post(http, f"{server.url}/register", body)
                                       for server, body in zip(servers, bodies, strict=True))))


def outcome(answers: list[tuple[int, Any]], code: str) -> str:
    """The winning service; fails unless one answer is 200 and the other a 409 ``code`` naming it."""
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 409], answers
    won = next(body for status, body in answers if status == 200)
    lost = next(body for status, body in answers if status == 409)
    assert lost["error"] == code and lost["owner"] == won["service"], answers
    return str(won["service"])


async def test_one_capability_name_has_one_owner(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    servers = [await etcd_registry(cluster), await etcd_registry(cluster)]
    for i in range(ROUNDS):
        name = f"shared.c{i}"
        winner = outcome(await race(http, servers, [registration(f"alpha-{i}", name, service="alpha"),
                                                    registration(f"beta-{i}", name, service="beta")]),
                         "capability_owned")
        await wait_for(lambda: all(s.registry.state.owner(name) == winner for s in servers),  # noqa: B023
                       what=f"both registries agree {winner} owns {name}")
        assert all(len(list(s.registry.state.holders(name))) == 1 for s in servers), "the loser stored nothing"


async def test_one_agent_id_has_one_service(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    servers = [await etcd_registry(cluster), await etcd_registry(cluster)]
    for i in range(ROUNDS):
        agent_id = f"agent-{i}"
        winner = outcome(await race(http, servers, [registration(agent_id, f"alpha.c{i}", service="alpha"),
                                                    registration(agent_id, f"beta.c{i}", service="beta")]),
                         "agent_id_taken")
        await wait_for(lambda: all(s.registry.state.agent_id_owner(agent_id) == winner  # noqa: B023
                                   for s in servers), what=f"both registries agree {agent_id} is {winner}'s")
