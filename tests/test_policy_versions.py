"""Version constraints: the grammar, a seeded property test of plan_route against a reference, and calls
through a real registry, router and agents on loopback."""

import asyncio
import random
from typing import Any

import pytest
from agent_reach import ReachClient, ReachError, SyncReachClient
from agent_reach.versions import check_constraint, instance_version, parse_constraint, parse_version, satisfies

from router.candidate import Candidate
from router.selection import RouteRefusal, plan_route
from router_support import Mesh
from sdk_support import refused_url, wait_state

SATISFIED = [
    (">=3.2", "3.2.0"), (">=3.2", "3.10.1"), ("^3", "3.9.1"), ("~3.2", "3.2.9"), ("3.2.1", "3.2.1"),
    (">=3,<4", "3.5"), ("3.2", "3.2.7"), ("*", "0.1"), ("3.x", "3.1"), (">3.2", "3.3.0"), ("^0.2.3", "0.2.9"),
    ("<=3.2", "3.2.9"), (">= 3.2", "3.2.0"), ("<4", "3.99.99"), ("3.3.0-rc.2", "3.3.0-rc.2"),
    (">=3.3.0-rc.1", "3.3.0-rc.2"), (">=3.3.0-rc.1", "3.3.0"),
]
UNSATISFIED = [
    (">=3.2", "3.1.9"), ("^3", "4.0.0"), ("~3.2", "3.3.0"), ("3.2.1", "3.2.2"), (">=3,<4", "4.0"),
    ("<4", "4.0.0-rc.1"), (">=3.3.0", "3.3.0-rc.1"), (">3.2", "3.2.5"), ("^0.2.3", "0.3.0"), ("3.2", "3.3.0"),
    (">=1", "not-a-version"), ("3.3.0-rc.2", "3.3.0-rc.10"),
]


@pytest.mark.parametrize(("constraint", "version"), SATISFIED)
def test_satisfied(constraint: str, version: str):
    assert satisfies(parse_version(version), parse_constraint(constraint))


@pytest.mark.parametrize(("constraint", "version"), UNSATISFIED)
def test_not_satisfied(constraint: str, version: str):
    assert not satisfies(parse_version(version), parse_constraint(constraint))


@pytest.mark.parametrize(("constraint", "problem"), [
    ("", "cannot be empty"), ("abc", "is not a version"), (">=4,<3", "no version satisfies"),
    ("=3.2.1 >3.2.1", "no version satisfies"), (">=3 <3", "no version satisfies"), ("1" * 129, "at most 128"),
])
def test_unusable_constraints_say_why(constraint: str, problem: str):
    message = check_constraint(constraint)
    assert message is not None and problem in message


def test_metadata_semver_stands_in_for_a_default_capability_version():
    assert instance_version("1.0", "3.2.1") == "3.2.1"
    assert instance_version("2.0", "3.2.1") == "2.0"
    assert instance_version("1.0", "") == "1.0"


def reference(constraint: tuple[str, tuple[int, int, int]], version: tuple[int, int, int]) -> bool:
    """The same rules written out plainly, for full x.y.z versions without pre-releases."""
    operator, bound = constraint
    if operator == ">=":
        return version >= bound
    if operator == "<":
        return version < bound
    if operator == "^":
        return version >= bound and version[0] == bound[0]
    if operator == "~":
        return version >= bound and version[:2] == bound[:2]
    return version == bound


def test_plan_route_never_picks_a_version_outside_the_constraint():
    rng = random.Random(1402)
    for _ in range(3000):
        versions = [(rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 3)) for _ in range(rng.randint(1, 8))]
        candidates = [Candidate(agent_id=f"a{i}", endpoint="http://127.0.0.1:9/call", protocol="rest",
                                state=rng.choice(["healthy", "healthy", "pending"]), version=".".join(map(str, v)))
                      for i, v in enumerate(versions)]
        constraints = [(rng.choice([">=", "<", "^", "~", ""]),
                        (rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 3))) for _ in range(rng.randint(1, 2))]
        texts = [operator + ".".join(map(str, bound)) for operator, bound in constraints]
        if any(check_constraint(text) for text in texts) or check_constraint(",".join(texts)):
            continue
        allowed = {c.agent_id for c, v in zip(candidates, versions, strict=True)
                   if all(reference(constraint, v) for constraint in constraints)}
        plan = plan_route(candidates, policy_name="least_load", hash_key="k", routing_hint=None, sticky_agent=None,
                          rng=rng, versions=tuple(texts))
        if isinstance(plan, RouteRefusal):
            assert not allowed and plan.code == "VERSION_UNSATISFIABLE", (texts, versions)
        else:
            assert plan.order and {c.agent_id for c in plan.order} <= allowed, (texts, versions)


async def three_versions(mesh: Mesh, start_agent: Any) -> list[Any]:
    """Instances of echo at 3.1.0, 3.2.0 and (by metadata.semver) 4.0.0."""
    agents = []
    for name, version, metadata in [("v31", "3.1.0", {}), ("v32", "3.2.0", {}), ("v40", "1.0", {"semver": "4.0.0"})]:
        agents.append(agent := await start_agent(name))
        await mesh.add(agent, "echo", metadata=metadata, version=version)
    return agents


async def test_calls_reach_only_instances_within_the_constraint(mesh: Mesh, start_agent: Any):
    await three_versions(mesh, start_agent)
    for constraint, expected in [(">=3.2,<4", {"3.2.0"}), ("^3", {"3.1.0", "3.2.0"}), (">=4", {"4.0.0"})]:
        seen = set()
        for _ in range(12):
            answer = await mesh.call("echo", {"n": 1}, version=constraint)
            assert answer.status == 200, answer.body
            seen.add(answer.route["version"])
        assert seen == expected, constraint


async def test_an_unsatisfiable_constraint_is_refused_without_a_call(mesh: Mesh, start_agent: Any):
    agents = await three_versions(mesh, start_agent)
    answer = await mesh.call("echo", {}, version="^5")
    assert answer.status == 503
    assert answer.body["error_code"] == "VERSION_UNSATISFIABLE" and answer.body["can_retry"] is False
    assert "^5" in answer.body["error_message"] and "3.1.0" in answer.body["error_message"]
    assert [agent.calls for agent in agents] == [0, 0, 0]
    totals = await mesh.reach_totals("echo")
    assert totals["failed_by_code"] == {"VERSION_UNSATISFIABLE": 1}


@pytest.mark.parametrize("constraint", ["abc", ">=4,<3", "x" * 200])
async def test_a_malformed_constraint_is_an_invalid_frame(mesh: Mesh, start_agent: Any, constraint: str):
    await three_versions(mesh, start_agent)
    answer = await mesh.call("echo", {}, version=constraint)
    assert answer.status == 400
    assert answer.body["error_code"] == "INVALID_FRAME" and answer.body["field"] == "version"


async def test_the_sdk_client_sends_a_constraint_and_the_direct_fallback_honours_it(registry, make_agent, http):
    """With the router down, the SDK's direct call filters versions as the router does: a hard filter."""
    called: dict[str, int] = {"geo-3": 0, "geo-4": 0}

    def answering(agent_id: str) -> Any:
        async def where(payload: Any, ctx: Any) -> str:
            called[agent_id] += 1
            return agent_id
        return where
    versions = {"geo-3": "3.9.0", "geo-4": "4.1.0"}
    agents = {agent_id: make_agent(agent_id, registry.url, service="geo", metadata={"semver": semver},
                                   direct_fallback=True) for agent_id, semver in versions.items()}
    for agent_id, agent in agents.items():
        agent.capability("geo.where")(answering(agent_id))
        await agent.start()
    for agent_id in agents:
        await wait_state(http, registry.url, agent_id, "healthy")
    async with ReachClient(refused_url(), direct_fallback=True,
                           registry_url=registry.url) as client:
        for _ in range(6):
            assert await client.call("geo.where", None, version="^4") == "geo-4"
        assert called == {"geo-3": 0, "geo-4": 6}
        with pytest.raises(ReachError) as caught:
            await client.call("geo.where", None, version=">=5")
        assert (caught.value.error_code, caught.value.can_retry) == ("VERSION_UNSATISFIABLE", False)
        with pytest.raises(ReachError) as caught:
            await client.call("geo.where", None, version="latest")
        assert caught.value.error_code == "INVALID_FRAME"
    assert called == {"geo-3": 0, "geo-4": 6}


async def test_the_sync_client_sends_the_constraint_to_the_router(mesh: Mesh, start_agent: Any):
    await three_versions(mesh, start_agent)
    answer = await asyncio.to_thread(sync_call, mesh.url)
    assert answer == ("v32", "3.2.0")


def sync_call(url: str) -> tuple[str, str | None]:
    with SyncReachClient(url) as client:
        result = client.call("echo", {}, version=">=3.2,<4")
        return result["agent"], client.last_route.version if client.last_route else None
