"""Weighted canaries: the split's validation, session-sticky assignment (a 5 % canary gets 5 % ± 1.5 % of
4,000 sessions through a real router), and automatic rollback written to the registry, followed by every
router, with an alert."""

import asyncio
from typing import Any

import aiohttp
import msgspec
import pytest

from conftest import wait_for
from mesh.policy import Policy, RollbackConfig, SplitShare
from mesh.records import policy_key
from mesh.watch import Reset
from router.canary import WindowFigures, assign, rollback_reason, share_point, stable_index
from router.mirror import RegistryMirror
from router.rollback import Releases
from router.server import RouterServer, RouterServerSettings
from router_support import Mesh, StartMesh

SPLIT = [SplitShare(version="3.2", weight=95), SplitShare(version="3.3", weight=5)]


def test_assignment_is_proportional_stable_and_skips_zero_weights():
    points = [share_point("echo", f"session-{n}") for n in range(20_000)]
    canary = sum(assign(SPLIT, point) == 1 for point in points) / len(points)
    assert 0.04 < canary < 0.06
    assert [assign(SPLIT, point) for point in points[:50]] == [assign(SPLIT, point) for point in points[:50]]
    rolled = [SplitShare(version="3.2", weight=95), SplitShare(version="3.3", weight=0)]
    assert {assign(rolled, point) for point in points} == {0}
    assert assign([SplitShare(version="1", weight=0)], 0.5) is None
    assert stable_index(SPLIT) == 0 and stable_index([SplitShare(version="1", weight=1),
                                                      SplitShare(version="2", weight=3)]) == 1


def test_rollback_needs_enough_calls_and_a_margin():
    config = RollbackConfig(metric="error_rate", worse_than_stable_by=0.1, min_calls=10, window_seconds=30)
    stable = WindowFigures(calls=100, error_rate=0.01, p99_ms=20)
    assert rollback_reason(config, WindowFigures(calls=9, error_rate=1.0, p99_ms=20), stable) is None
    assert rollback_reason(config, WindowFigures(calls=10, error_rate=0.11, p99_ms=20), stable) is None
    reason = rollback_reason(config, WindowFigures(calls=10, error_rate=0.5, p99_ms=20), stable)
    assert reason is not None and "error_rate 0.5 vs stable 0.01" in reason
    slow = msgspec.structs.replace(config, metric="p99_ms", worse_than_stable_by=50)
    assert rollback_reason(slow, WindowFigures(calls=10, error_rate=0, p99_ms=60), stable) is None
    assert rollback_reason(slow, WindowFigures(calls=10, error_rate=0, p99_ms=80), stable) is not None


async def put(mesh: Mesh, body: Any) -> tuple[int, Any]:
    async with mesh.http.put(f"{mesh.registry.url}/policies/echo", json=body, headers=mesh.admin) as answer:
        return answer.status, await answer.json()


@pytest.mark.parametrize(("body", "field"), [
    ({"split": [{"version": "3", "weight": 95}, {"version": "3.3", "weight": 5}]}, "split[1].version"),
    ({"split": [{"version": "3.2", "weight": 0}, {"version": "3.3", "weight": 0}]}, "split"),
    ({"split": [{"version": "3.2", "weight": -1}]}, "split[0].weight"),
    ({"split": [{"version": "three", "weight": 1}]}, "split[0].version"),
    ({"split": [{"version": "3.2", "weight": 1}], "rollback": {"worse_than_stable_by": 0.1}}, "rollback"),
    ({"split": [{"version": "3.2", "weight": 1}, {"version": "3.3", "weight": 1}], "rollback": {}},
     "rollback.worse_than_stable_by"),
])
async def test_a_bad_split_is_refused_and_changes_nothing(mesh: Mesh, body: dict[str, Any], field: str):
    before = await mesh.put_policy("echo", {"split": [msgspec.to_builtins(share) for share in SPLIT]})
    status, answer = await put(mesh, body)
    assert status == 400 and answer["field"] == field, answer
    async with mesh.http.get(f"{mesh.registry.url}/policies/echo", headers=mesh.admin) as response:
        assert msgspec.convert(await response.json(), Policy) == before


async def two_versions(mesh: Mesh, start_agent: Any) -> dict[str, Any]:
    agents = {"stable": await start_agent("stable"), "canary": await start_agent("canary")}
    await mesh.add(agents["stable"], "echo", version="3.2.4")
    await mesh.add(agents["canary"], "echo", version="3.3.0")
    return agents


async def test_a_five_percent_canary_gets_five_percent_of_sessions_and_keeps_them(mesh: Mesh, start_agent: Any):
    await two_versions(mesh, start_agent)
    await mesh.put_policy("echo", {"split": [msgspec.to_builtins(share) for share in SPLIT]})
    versions: dict[str, set[str]] = {}

    async def session(n: int, calls: int) -> None:
        for _ in range(calls):
            answer = await mesh.call("echo", {}, context={"session_id": f"s-{n}"})
            assert answer.status == 200, answer.body
            versions.setdefault(f"s-{n}", set()).add(answer.route["version"])
    for start in range(0, 4000, 100):
        await asyncio.gather(*(session(n, 3 if n < 200 else 1) for n in range(start, start + 100)))
    assert all(len(seen) == 1 for seen in versions.values())  # every call of a session on one version
    canary = sum(seen == {"3.3.0"} for seen in versions.values()) / len(versions)
    assert 0.035 <= canary <= 0.065, canary
    answer = await mesh.call("echo", {}, context={"session_id": "s-1"})
    assert answer.route["reason"].startswith("split: version 3.")


async def test_a_canary_without_instances_sends_its_sessions_to_stable(mesh: Mesh, start_agent: Any):
    stable = await start_agent("stable")
    await mesh.add(stable, "echo", version="3.2.4")
    await mesh.put_policy("echo", {"split": [{"version": "3.2", "weight": 1}, {"version": "3.3", "weight": 99}]})
    for n in range(20):
        answer = await mesh.call("echo", {}, context={"session_id": f"s-{n}"})
        assert answer.status == 200 and answer.route["version"] == "3.2.4"


async def fail_the_canary_until_rolled_back(first: Mesh, second: Mesh, agents: dict[str, Any]) -> None:
    """Make the canary fail and call through ``first`` until ``second`` holds the canary's weight 0."""
    await wait_for(lambda: second.router.mirror.offers("echo") is not None and
                   len(second.router.mirror.offers("echo") or []) == 2, timeout=5, what="the second router's view")
    agents["canary"].status = 500
    rollback = {"metric": "error_rate", "worse_than_stable_by": 0.2, "min_calls": 10, "window_seconds": 30}
    # 20 %: the canary's failures stay below the capability's breaker threshold (50 %), so stable keeps serving.
    await first.put_policy("echo", {"split": [{"version": "3.2", "weight": 80}, {"version": "3.3", "weight": 20}],
                                    "rollback": rollback})
    await wait_for(lambda: second.router.mirror.policy("echo") == first.router.mirror.policy("echo"), timeout=5,
                   what="the second router to hold the split")
    n = 0

    async def rolled_back() -> bool:
        nonlocal n
        n += 1
        await first.call("echo", {}, context={"session_id": f"s-{n}"})
        policy = second.router.mirror.policy("echo")
        return policy is not None and policy.split[1].weight == 0
    await wait_for(rolled_back, timeout=20, interval=0, what="the canary's rollback to reach the second router")


async def test_a_failing_canary_is_rolled_back_and_every_router_follows(start_mesh: StartMesh, start_agent: Any):
    first = await start_mesh(follow="http")
    second = await start_mesh(follow="http", registry=first.registry)
    agents = await two_versions(first, start_agent)
    await fail_the_canary_until_rolled_back(first, second, agents)
    async with first.http.get(f"{first.registry.url}/policies/echo") as response:
        stored = msgspec.convert(await response.json(), Policy)
    assert [(share.version, share.weight) for share in stored.split] == [("3.2", 80), ("3.3", 0)]
    assert stored.rollback is not None  # nothing else of the policy changed
    [alert] = (await first.get("/alerts"))["rollbacks"]
    assert (alert["capability"], alert["version"], alert["stable"], alert["written"]) == ("echo", "3.3", "3.2", True)
    assert "error_rate" in alert["reason"]
    canary_calls = agents["canary"].calls
    for router in (first, second):
        for k in range(20):
            answer = await router.call("echo", {}, context={"session_id": f"after-{k}"})
            assert answer.status == 200 and answer.route["version"] == "3.2.4"
    assert agents["canary"].calls == canary_calls


async def test_a_router_beside_its_registry_writes_the_rollback_in_process(start_mesh: StartMesh, start_agent: Any,
                                                                          http: aiohttp.ClientSession):
    """As `agentreach up` runs it: following the hub, writing through the registry's own put_policy."""
    second = await start_mesh()
    registry = second.registry
    assert registry.registry is not None
    server = RouterServer(RouterServerSettings(port=0, auth=False), hub=registry.hub,
                          write_policy=registry.registry.put_policy)
    await server.start()
    first = Mesh(registry, server, http)
    try:
        await wait_for(lambda: server.mirror.synced, timeout=5, what="the in-process router to load the registry")
        agents = await two_versions(second, start_agent)
        await wait_for(lambda: len(server.mirror.offers("echo") or []) == 2, timeout=5, what="both instances")
        await fail_the_canary_until_rolled_back(first, second, agents)
        assert [alert["written"] for alert in (await first.get("/alerts"))["rollbacks"]] == [True]
    finally:
        await first.close()


async def test_a_rollback_the_registry_refuses_is_alerted_once_and_retried():
    mirror = RegistryMirror()
    policy = Policy(split=SPLIT, rollback=RollbackConfig(worse_than_stable_by=0.1, min_calls=5, window_seconds=60))
    mirror.apply(Reset(revision=1, records={policy_key("echo"): policy}, states={}))
    releases, tries = Releases(), []

    async def refuse(capability: str, written: Policy, based_on: str) -> None:
        tries.append(written)
        raise RuntimeError("registry answered 503")
    releases.write = refuse
    for _ in range(5):
        releases.record("echo", "3.2", True, 1.0)
        releases.record("echo", "3.3", False, 1.0)
    await releases.judge(mirror)
    await releases.judge(mirror)
    assert [(share.version, share.weight) for share in tries[-1].split] == [("3.2", 95), ("3.3", 0)]
    assert len(tries) == 2 and [alert.written for alert in releases.rollbacks] == [False]

    async def accept(capability: str, written: Policy, based_on: str) -> None:
        tries.append(written)
    releases.write = accept
    await releases.judge(mirror)
    assert [alert.written for alert in releases.rollbacks] == [True, False] and len(tries) == 3
