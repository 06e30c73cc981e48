"""Revoking a registration token takes its instances out of rotation at once (hardening item 10).

A real registry with auth on, a real router following it and real SDK agents holding tokens, all
on 127.0.0.1: the revocation goes through the admin API, calls through the router, and the
registry restarts from its WAL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agent_reach import ReachClient, ReachError

from conftest import registration
from registry.server import RegistryServer
from sdk_support import TokenMesh, counting_agent

Start = Callable[..., Awaitable[RegistryServer]]


async def revoke(mesh: TokenMesh, token_id: str) -> None:
    async with mesh.http.post(f"{mesh.registry.url}/tokens/{token_id}/revoke", headers=mesh.admin) as response:
        assert response.status == 200, await response.text()


async def test_revoked_tokens_instances_get_no_further_call_and_stay_evicted_after_a_restart(
        token_mesh: TokenMesh, make_agent: Any, start_registry: Start) -> None:
    revoked = await token_mesh.token("omega")
    kept = await token_mesh.token("keep")
    agent, ran = counting_agent(make_agent, "omega-1", token_mesh, "omega.echo", registration_token=revoked["token"])
    other, _ = counting_agent(make_agent, "keep-1", token_mesh, "keep.echo", registration_token=kept["token"])
    await agent.start()
    await other.start()
    await token_mesh.routable("omega-1")
    await token_mesh.routable("keep-1")
    async with ReachClient(token_mesh.router.url) as client:
        assert await client.call("omega.echo", 1) == {"echo": 1}

        await revoke(token_mesh, revoked["token_id"])
        with pytest.raises(ReachError) as caught:
            await client.call("omega.echo", 2)
        assert caught.value.error_code == "UNKNOWN_CAPABILITY", "its only instance is out of rotation"
        assert ran == [1], "the very next call did not reach the instance"
        assert await client.call("keep.echo", 3) == {"echo": 3}, "another token's instance still serves"
    async with token_mesh.http.get(f"{token_mesh.registry.url}/agents", headers=token_mesh.admin) as response:
        states = {view["agent_id"]: view["state"] for view in (await response.json())["agents"]}
    assert states == {"omega-1": "evicted", "keep-1": "healthy"}

    data_dir = token_mesh.registry.settings.data_dir
    await token_mesh.registry.stop()
    again = await start_registry(data_dir=data_dir, auth=True)
    async with token_mesh.http.get(f"{again.url}/agents", headers=token_mesh.admin) as response:
        states = {view["agent_id"]: view["state"] for view in (await response.json())["agents"]}
    assert states == {"omega-1": "evicted", "keep-1": "pending"}, "the eviction is in the WAL"


async def test_a_registration_racing_a_revocation_never_ends_up_serving(token_mesh: TokenMesh) -> None:
    outcomes = []
    for round_ in range(20):
        issued = await token_mesh.token("racer")

        async def register(agent_id: str = f"racer-{round_}", token: str = issued["token"]) -> int:
            status, _ = await token_mesh.registry_post("/register", registration(agent_id, "racer.echo"), token)
            return status

        # Which request leaves first alternates; the registry's order decides, the invariant holds either way.
        if round_ % 2:
            status, _ = await asyncio.gather(register(), revoke(token_mesh, issued["token_id"]))
        else:
            _, status = await asyncio.gather(revoke(token_mesh, issued["token_id"]), register())
        outcomes.append(status)
        state = token_mesh.registry.registry.state
        serving = [agent_id for agent_id, record in state.records.items()
                   if record.token_id == issued["token_id"] and record.evicted_at is None]
        assert serving == [], (round_, status)
    assert set(outcomes) <= {200, 401}, outcomes
