"""Traffic mirroring through a real registry, router and agents: copies reach the mirror version, are
compared and recorded, never answer the caller and never count in reach; a capability not declared
idempotent is mirrored only when its policy says so."""

from typing import Any

import pytest

from conftest import wait_for
from mesh.policy import MirrorConfig
from router.traffic_mirror import mirrored
from router_support import Mesh

# Live traffic stays on 1.x; 2.x only ever sees copies.
STABLE_ONLY = [{"version": "1", "weight": 100}, {"version": "2", "weight": 0}]


def test_the_share_mirrored_follows_the_percent_and_the_idempotency_gate():
    config = MirrorConfig(version="2", percent=10)
    share = sum(mirrored(config, "echo", f"req-{n}", True) for n in range(20_000)) / 20_000
    assert 0.09 < share < 0.11
    assert not any(mirrored(config, "echo", f"req-{n}", False) for n in range(1000))
    forced = MirrorConfig(version="2", percent=100, allow_non_idempotent=True)
    assert all(mirrored(forced, "echo", f"req-{n}", False) for n in range(100))


async def mirrored_mesh(mesh: Mesh, start_agent: Any, *, idempotent: bool = True, **mirror: Any) -> dict[str, Any]:
    agents = {"v1": await start_agent("v1"), "v2": await start_agent("v2")}
    await mesh.add(agents["v1"], "echo", version="1.4.0", idempotent=idempotent)
    await mesh.add(agents["v2"], "echo", version="2.0.0", idempotent=idempotent)
    await mesh.put_policy("echo", {"split": STABLE_ONLY, "mirror": {"version": "2", "percent": 100, **mirror}})
    return agents


async def mirror_stats(mesh: Mesh) -> dict[str, Any]:
    [stats] = (await mesh.get("/rules/stats?capability=echo"))["mirror"]
    return stats


async def test_copies_are_compared_and_never_answer_or_count(mesh: Mesh, start_agent: Any):
    agents = await mirrored_mesh(mesh, start_agent)
    agents["v2"].status = 500
    for n in range(10):
        answer = await mesh.call("echo", {"n": n}, request_id=f"live-{n}")
        assert answer.status == 200 and answer.body["result"]["agent"] == "v1" and answer.route["version"] == "1.4.0"
    await wait_for(lambda: agents["v2"].calls == 10, timeout=5, what="every copy to reach v2")

    async def compared() -> dict[str, Any] | None:
        stats = await mirror_stats(mesh)
        return stats if stats["different_status"] == 10 else None
    stats = await wait_for(compared, timeout=5, what="every copy compared")
    assert (stats["sent"], stats["same_status"], stats["skipped"]) == (10, 0, 0)
    assert (stats["samples"][-1]["live"], stats["samples"][-1]["mirror"]) == ("success", "AGENT_ERROR")
    assert stats["samples"][-1]["request_id"] == "live-9" and len(stats["samples"]) == 5
    copy = agents["v2"].received[-1]
    assert copy.headers["X-Request-Id"] != "live-9"
    totals = await mesh.reach_totals("echo")
    assert (totals["total"], totals["success"], totals["failed"]) == (10, 10, 0)  # copies are not calls


async def test_matching_copies_count_as_the_same(mesh: Mesh, start_agent: Any):
    agents = await mirrored_mesh(mesh, start_agent)
    for _ in range(5):
        await mesh.call("echo", {})

    async def compared() -> dict[str, Any] | None:
        stats = await mirror_stats(mesh)
        return stats if stats["same_status"] == 5 else None
    stats = await wait_for(compared, timeout=5, what="every copy compared")
    assert stats["different_status"] == 0 and stats["samples"] == [] and agents["v2"].calls == 5


@pytest.mark.parametrize(("allow", "copies"), [(False, 0), (True, 4)])
async def test_a_capability_not_idempotent_is_mirrored_only_when_the_policy_says_so(
        mesh: Mesh, start_agent: Any, allow: bool, copies: int):
    agents = await mirrored_mesh(mesh, start_agent, idempotent=False, allow_non_idempotent=allow)
    for _ in range(4):
        assert (await mesh.call("echo", {})).body["result"]["agent"] == "v1"
    await wait_for(lambda: agents["v2"].calls == copies, timeout=5, what="the copies")
    assert [stats.sent for stats in mesh.router.traffic_mirror.stats("echo")] == ([copies] if allow else [])


async def test_a_bad_mirror_is_refused(mesh: Mesh):
    async with mesh.http.put(f"{mesh.registry.url}/policies/echo", json={"mirror": {"version": "latest", "percent": 5}},
                             headers=mesh.admin) as answer:
        assert answer.status == 400 and (await answer.json())["field"] == "mirror.version"
    async with mesh.http.put(f"{mesh.registry.url}/policies/echo", json={"mirror": {"version": "2", "percent": 0}},
                             headers=mesh.admin) as answer:
        assert answer.status == 400 and (await answer.json())["field"] == "mirror.percent"
