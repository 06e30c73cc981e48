"""The console given several registries and routers (issue 13 point 3): it follows the first it can
reach, so a dead URL first in each list still shows the live mesh. A "dead" URL is a free port on
127.0.0.1 with nothing listening; the mesh is real."""

from __future__ import annotations

from console_support import Rig
from sdk_support import refused_url


async def test_a_console_given_dead_then_live_urls_shows_the_live_mesh(start_mesh, start_console, start_agent, http):
    mesh = await start_mesh()
    registries, routers = f"{refused_url()},{mesh.registry.url}", f"{refused_url()},{mesh.url}"
    rig = Rig(mesh, await start_console(registries, routers), http)
    await mesh.add_all([await start_agent("a1")])
    assert await rig.get("/api/config") == {"auth": "off", "registry_url": registries, "router_url": routers,
                                            "poll_interval": 0.2}
    for i in range(5):
        assert (await mesh.call(payload=i)).status == 200
    overview = await rig.until("/api/overview", lambda o: o["available_instances"] == 1 and o["curve"],
                               "the live registry's agent and the live router's calls")
    assert overview["registry"]["ok"] and overview["router"]["ok"] and overview["traces"]["ok"]
    assert sum(point["total"] for point in overview["curve"]) == 5
    [row] = (await rig.get("/api/agents"))["agents"]
    assert (row["agent_id"], row["state"]) == ("a1", "healthy")
    assert (await rig.get("/api/agents/a1"))["agent"]["agent_id"] == "a1"
