"""A router in its own role (`agentreach router --registry URL`) following the registry over
HTTP `GET /watch`: changes as they are made, its last view while the registry is away, and resuming."""

from __future__ import annotations

from conftest import wait_for
from registry.lifecycle import LifecycleConfig
from registry.server import RegistryServer, RegistrySettings
from router_support import QUIET_LIFECYCLE, Mesh, capability


async def test_router_follows_registry_changes_over_http(start_mesh, start_agent):
    # The feed pushes each change as it is written, with no polling period to bound: waiting with the
    # usual deadline catches a change that never arrives; a one-second one would measure the machine.
    mesh: Mesh = await start_mesh(follow="http")
    assert mesh.router_server.settings.registry_url == mesh.registry.url
    first, second = await start_agent("w-1"), await start_agent("w-2")
    await mesh.register("w-1", [capability("echo", first.endpoint)])
    await wait_for(lambda: "w-1" in mesh.router.mirror.instances, what="the registration to reach the router")
    assert (await mesh.call(payload="hi")).body["result"]["agent"] == "w-1"
    await mesh.ready("w-1")
    # A policy change is applied to the next calls.
    async with mesh.http.put(f"{mesh.registry.url}/policies/echo", json={"policy": "hash"}) as response:
        assert response.status == 200

    async def hashed() -> bool:
        return (await mesh.call(payload="x", context={"session_id": "s"})).route["policy"] == "hash"
    await wait_for(hashed, what="the policy change to reach the router")
    # A second instance joins, the first leaves: calls follow.
    await mesh.register("w-2", [capability("echo", second.endpoint)])
    await wait_for(lambda: "w-2" in mesh.router.mirror.instances, what="the second registration")
    await mesh.deregister("w-1")
    await wait_for(lambda: "w-1" not in mesh.router.mirror.instances, what="the deregistration")
    answers = [await mesh.call(payload=i, context={"session_id": f"s-{i}"}) for i in range(10)]
    assert {answer.body["result"]["agent"] for answer in answers} == {"w-2"}
    await mesh.deregister("w-2")

    async def gone() -> bool:
        return (await mesh.call(payload="x")).status == 503  # a policy exists, so: an empty pool
    await wait_for(gone, what="the last deregistration")
    # The policy is deleted: the capability is unknown now.
    async with mesh.http.delete(f"{mesh.registry.url}/policies/echo") as response:
        assert response.status == 200

    async def unknown() -> bool:
        return (await mesh.call(payload="x")).status == 404
    await wait_for(unknown, what="the policy deletion")


async def test_router_keeps_its_last_view_while_the_registry_restarts(start_mesh, start_agent, router_logs, tmp_path):
    lifecycle = LifecycleConfig(**QUIET_LIFECYCLE)
    registry = RegistryServer(RegistrySettings(data_dir=tmp_path / "reg", port=0, lifecycle=lifecycle, auth=False))
    await registry.start()
    restarted: RegistryServer | None = None
    try:
        mesh: Mesh = await start_mesh(follow="http", registry=registry)
        agent, newcomer = await start_agent("steady"), await start_agent("newcomer")
        await mesh.add(agent)
        revision = mesh.router.mirror.revision
        await registry.stop()
        await wait_for(lambda: router_logs.named("registry watch interrupted; routing on the last view"),
                       timeout=5, what="the router to notice the registry is gone")
        # The registry is away: routing goes on from the last view, as healthy as it was.
        for i in range(10):
            answer = await mesh.call(payload=i)
            assert answer.status == 200 and not answer.route.get("degraded"), answer.body
        health = await mesh.get("/healthz")
        assert health["registry_synced"] is True and health["revision"] == revision
        # Back on the same port, from its WAL: the router resumes from its revision.
        restarted = RegistryServer(RegistrySettings(data_dir=tmp_path / "reg", port=registry.port, lifecycle=lifecycle,
                                                    auth=False))
        await restarted.start()
        mesh.registry = restarted
        follows = len(router_logs.named("following registry"))
        await wait_for(lambda: len(router_logs.named("following registry")) > follows, timeout=8,
                       what="the router to reconnect")
        assert router_logs.named("following registry")[-1]["since"] == str(revision)
        await mesh.register("newcomer", [capability("echo", newcomer.endpoint)])
        await wait_for(lambda: "newcomer" in mesh.router.mirror.instances, what="a change after the restart")
        await mesh.ready("steady", "newcomer")
        answers = [await mesh.call(payload=i) for i in range(20)]
        assert all(answer.status == 200 for answer in answers)
        assert {answer.route["instance"] for answer in answers} == {"steady", "newcomer"}
    finally:
        if restarted is not None:
            await restarted.stop()
        await registry.stop()
