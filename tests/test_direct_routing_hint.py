"""The direct fallback honours ``context.routing_hint`` as the router does: a hard filter. With the router
down, a call hinted to zone b reaches only b's instance, and a hint no instance matches fails with the
router's own code without calling anyone (a staging caller never reaches production)."""

from __future__ import annotations

import pytest
from agent_reach import ReachClient, ReachError

from sdk_support import refused_url, wait_state


async def test_direct_fallback_calls_only_instances_matching_the_hint(registry, make_agent, http):
    called: dict[str, int] = {"geo-a": 0, "geo-b": 0}
    for agent_id, zone in (("geo-a", "a"), ("geo-b", "b")):
        agent = make_agent(agent_id, registry.url, service="geo", metadata={"zone": zone}, direct_fallback=True)

        @agent.capability("geo.where")
        async def where(payload, ctx, agent_id=agent_id):
            called[agent_id] += 1
            return agent_id

        await agent.start()
        await wait_state(http, registry.url, agent_id, "healthy")

    async with ReachClient(refused_url(), direct_fallback=True,
                           registry_url=registry.url) as client:
        for _ in range(10):
            assert await client.call("geo.where", None, context={"routing_hint": {"zone": "b"}}) == "geo-b"
            assert client.last_route.instance == "geo-b" and client.last_route.reason == "direct_fallback"
        assert called == {"geo-a": 0, "geo-b": 10}

        with pytest.raises(ReachError) as caught:
            await client.call("geo.where", None, context={"routing_hint": {"zone": "c"}})
        assert (caught.value.error_code, caught.value.can_retry) == ("ROUTING_HINT_UNSATISFIABLE", False)
        assert "zone='c'" in str(caught.value)
        assert called == {"geo-a": 0, "geo-b": 10}
