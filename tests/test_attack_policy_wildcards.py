"""Conditional policy writes with the RFC 9110 wildcards: ``If-Match: *`` (over any stored policy; none: refused)
and ``If-None-Match: *`` (create only: refused when a policy is stored), so a writer creating a policy never overwrites
one another writer created meanwhile. A real registry over HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp

from conftest import admin_key, call

FIRST = {"policy": "hash"}
SECOND = {"policy": "least_load"}


async def put_if(http: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any],
                 **conditions: str) -> tuple[int, Any]:
    headers = {"X-API-Key": key, **{name.replace("_", "-"): value for name, value in conditions.items()}}
    async with http.put(f"{url}/policies/echo", json=body, headers=headers) as response:
        return response.status, await response.json()


async def test_if_none_match_star_creates_only_a_policy_nobody_stored(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    status, created = await put_if(http, registry.url, key, FIRST, If_None_Match="*")
    assert (status, created["policy"]) == (200, "hash"), created
    status, body = await put_if(http, registry.url, key, SECOND, If_None_Match="*")
    assert (status, body["error"], body["field"]) == (409, "policy_exists", "If-None-Match"), body
    assert body["policy"]["policy"] == "hash"
    assert (await call(http, "GET", f"{registry.url}/policies/echo", key))[1]["policy"] == "hash"
    status, body = await put_if(http, registry.url, key, SECOND, If_None_Match='"abc"')
    assert (status, body["error"], body["field"]) == (400, "invalid_field", "If-None-Match"), body


async def test_if_match_star_writes_over_any_stored_policy_and_none_is_refused(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    status, body = await put_if(http, registry.url, key, FIRST, If_Match="*")
    assert (status, body["error"], body["field"], body["policy"]) == (409, "policy_changed", "If-Match", None), body
    assert (await call(http, "GET", f"{registry.url}/policies/echo", key))[0] == 404
    assert (await put_if(http, registry.url, key, FIRST))[0] == 200
    status, body = await put_if(http, registry.url, key, SECOND, If_Match="*")
    assert (status, body["policy"]) == (200, "least_load"), body
