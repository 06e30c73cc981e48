"""Races between a router rolling a canary back and an operator editing the same policy: the rollback is
written only over the policy it was judged under, so an operator's edit made a moment earlier (one the
router's feed has not brought yet) is never lost; at one registry (WAL) and at two registry nodes on a real
3-member etcd, the edit and the rollback sent at once, over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec

from conftest import admin_key, call, wait_for
from mesh.policy import Policy
from mesh.records import policy_key
from mesh.watch import Reset
from registry.access import read_admin_key
from router.mirror import RegistryMirror
from router.rollback import Releases, write_policy_over_http

SPLIT = {"split": [{"version": "3.2", "weight": 95}, {"version": "3.3", "weight": 5}],
         "rollback": {"metric": "error_rate", "worse_than_stable_by": 0.1, "min_calls": 5, "window_seconds": 60}}
# The operator's edit: the whole document as they read it, with a fallback added.
EDITED = {**SPLIT, "fallback_capability": "echo.backup"}
ROUNDS = 20


def failing_canary(http: aiohttp.ClientSession, url: str, key: str) -> Releases:
    """A router's releases that judge the 3.3 canary failing, writing over HTTP to the registry at ``url``."""
    releases = Releases()
    releases.write = lambda *args: write_policy_over_http(http, url, key, *args)
    for _ in range(5):
        releases.record("echo", "3.2", True, 1.0)
        releases.record("echo", "3.3", False, 1.0)
    return releases


def held(policy: Policy) -> RegistryMirror:
    """A router's view holding ``policy``: its feed has not brought anything newer yet."""
    mirror = RegistryMirror()
    mirror.apply(Reset(revision=1, records={policy_key("echo"): policy}, states={}))
    return mirror


async def put(http: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any]) -> Policy:
    status, stored = await call(http, "PUT", f"{url}/policies/echo", key, body)
    assert status == 200, stored
    return msgspec.convert(stored, Policy)


async def stored(http: aiohttp.ClientSession, url: str, key: str) -> Policy:
    status, policy = await call(http, "GET", f"{url}/policies/echo", key)
    assert status == 200, policy
    return msgspec.convert(policy, Policy)


async def settled(http: aiohttp.ClientSession, urls: set[str], key: str) -> Policy:
    """The policy once every registry node holds the same (each acknowledged a write once it held it)."""
    async def agreed() -> Policy | None:
        seen = [await stored(http, url, key) for url in urls]
        return seen[0] if all(policy == seen[0] for policy in seen) else None
    return await wait_for(agreed, timeout=5, what="the registry nodes to agree on the policy")


def weights(policy: Policy) -> list[int]:
    return [share.weight for share in policy.shares]


async def race(http: aiohttp.ClientSession, operator_url: str, router_url: str, key: str) -> list[Policy]:
    """Each round: the split stored afresh, then the operator's edit and the router's rollback sent at once. The
    policy stored after each round."""
    after = []
    for _ in range(ROUNDS):
        judged = await put(http, operator_url, key, SPLIT)
        releases = failing_canary(http, router_url, key)
        await asyncio.gather(put(http, operator_url, key, EDITED), releases.judge(held(judged)))
        after.append(await settled(http, {operator_url, router_url}, key))
    return after


async def edit_then_roll_back(http: aiohttp.ClientSession, operator_url: str, releases: Releases, key: str) -> None:
    """The operator edits the split the router then judges under, its feed not having brought the edit yet."""
    judged = await put(http, operator_url, key, SPLIT)
    await put(http, operator_url, key, EDITED)
    await releases.judge(held(judged))


def edited_and_rolled_back(policy: Policy) -> bool:
    return policy.fallback_capability == "echo.backup" and weights(policy) == [95, 0]


async def test_a_rollback_keeps_an_edit_the_router_has_not_seen(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    releases = failing_canary(http, registry.url, key)
    await edit_then_roll_back(http, registry.url, releases, key)
    assert edited_and_rolled_back(await stored(http, registry.url, key))
    assert [alert.written for alert in releases.rollbacks] == [True]


async def test_an_edit_sent_with_a_rollback_is_never_lost(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    after = await race(http, registry.url, registry.url, key)
    # Either order may win: the rollback over the edit, or the operator's whole document over the rollback.
    assert all(policy.fallback_capability == "echo.backup" for policy in after), after
    assert {tuple(weights(policy)) for policy in after} <= {(95, 0), (95, 5)}


async def test_at_two_etcd_nodes_a_rollback_keeps_the_edit_made_at_the_other(etcd_cluster, etcd_registry, http):
    cluster = await etcd_cluster()
    operator, router = await etcd_registry(cluster, auth=True), await etcd_registry(cluster, auth=True)
    key = read_admin_key(operator.settings.data_dir)
    assert key is not None
    await edit_then_roll_back(http, operator.url, failing_canary(http, router.url, key), key)
    assert edited_and_rolled_back(await settled(http, {operator.url, router.url}, key))
    after = await race(http, operator.url, router.url, key)
    assert all(policy.fallback_capability == "echo.backup" for policy in after), after


async def test_in_process_a_rollback_keeps_the_edit_too(start_registry, http):
    """As `agentreach up` runs it: the router writes through the registry's own put_policy."""
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    releases = failing_canary(http, registry.url, key)
    assert registry.registry is not None
    releases.write = registry.registry.put_policy
    await edit_then_roll_back(http, registry.url, releases, key)
    assert edited_and_rolled_back(await stored(http, registry.url, key))


async def test_an_edit_that_drops_the_rollback_rule_is_respected(start_registry, http, router_logs):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    judged = await put(http, registry.url, key, SPLIT)
    edited = await put(http, registry.url, key, {"split": SPLIT["split"]})
    releases = failing_canary(http, registry.url, key)
    await releases.judge(held(judged))
    assert await stored(http, registry.url, key) == edited
    assert list(releases.rollbacks) == []
    [line] = [line for line in router_logs.lines if line["event"].startswith("canary rollback not written")]
    assert "no longer" in line["event"] and (line["capability"], line["version"]) == ("echo", "3.3")


async def test_two_routers_rolling_back_one_canary_write_once(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    judged = await put(http, registry.url, key, SPLIT)
    first, second = failing_canary(http, registry.url, key), failing_canary(http, registry.url, key)
    await first.judge(held(judged))
    await second.judge(held(judged))
    assert weights(await stored(http, registry.url, key)) == [95, 0]
    assert [alert.written for alert in first.rollbacks] == [True] and list(second.rollbacks) == []


async def test_a_write_if_match_an_older_policy_is_refused_with_the_stored_one(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    await put(http, registry.url, key, SPLIT)
    async with http.get(f"{registry.url}/policies/echo", headers={"X-API-Key": key}) as response:
        judged = response.headers["ETag"]
    edited = await put(http, registry.url, key, EDITED)

    async def put_if(tag: str) -> tuple[int, Any, str | None]:
        async with http.put(f"{registry.url}/policies/echo", json=SPLIT,
                            headers={"X-API-Key": key, "If-Match": tag}) as response:
            return response.status, await response.json(), response.headers.get("ETag")
    status, body, _ = await put_if(judged)
    assert (status, body["error"], body["field"]) == (409, "policy_changed", "If-Match"), body
    assert msgspec.convert(body["policy"], Policy) == edited == await stored(http, registry.url, key)
    for malformed in (judged.strip('"'), f"{judged}, {judged}", f"W/{judged}"):
        status, body, _ = await put_if(malformed)
        assert (status, body["error"], body["field"]) == (400, "invalid_field", "If-Match"), (malformed, body)
    async with http.get(f"{registry.url}/policies/echo", headers={"X-API-Key": key}) as response:
        current = response.headers["ETag"]
    status, body, tag = await put_if(current)
    assert status == 200 and tag is not None and tag != current
    assert (await call(http, "DELETE", f"{registry.url}/policies/echo", key))[0] == 200
    status, body, _ = await put_if(tag)
    assert (status, body["error"], body["policy"]) == (409, "policy_changed", None)
    assert (await call(http, "GET", f"{registry.url}/policies/echo", key))[0] == 404
