"""Caller authentication and authorization on the router, with API keys: every way a call is refused,
with nothing forwarded, and the limits on what a request may carry.

A real registry (auth on) and a real router follow each other on 127.0.0.1; clients are made
through the registry's admin API with its admin key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import wait_for


def key(client: dict[str, Any]) -> dict[str, str]:
    return {"X-API-Key": client["api_key"]}


def assert_refused(answer, status: int, code: str) -> None:
    assert answer.status == status, answer.body
    assert answer.body["error_code"] == code
    assert answer.body["can_retry"] is (code == "BUSY")
    assert answer.body["request_id"] == answer.headers["X-Request-Id"]


async def test_a_call_without_a_credential_is_refused_unforwarded_and_traced(secure):
    mesh, agent = secure
    answer = await mesh.call("echo", {"n": 1}, request_id="anon-1")
    assert_refused(answer, 401, "UNAUTHENTICATED")
    assert "X-API-Key" in answer.body["error_message"]
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert agent.calls == 0
    assert mesh.router.decisions["unauthenticated"] == 1
    trace = await mesh.get("/traces/anon-1")
    assert trace["call"]["error_code"] == "UNAUTHENTICATED" and trace["call"]["caller"] is None
    assert trace["call"]["attempts"] == []


async def test_an_unknown_api_key_is_refused(secure):
    mesh, agent = secure
    assert_refused(await mesh.call("echo", headers={"X-API-Key": "ark_not-a-key"}), 401, "UNAUTHENTICATED")
    assert_refused(await mesh.call("echo", headers={"Authorization": "Basic eDp5"}), 401, "UNAUTHENTICATED")
    assert agent.calls == 0


async def test_a_granted_api_key_calls_through_and_is_the_traced_caller(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    answer = await mesh.call("echo", {"n": 1}, headers=key(client), request_id="keyed-1")
    assert answer.status == 200, answer.body
    assert answer.body["result"]["echo"] == {"n": 1}
    assert agent.calls == 1
    assert (await mesh.get("/traces/keyed-1"))["call"]["caller"] == client["client_id"]
    # The API key is the router's business: the agent never sees it.
    assert "X-API-Key" not in agent.received[0].headers


async def test_a_disabled_client_is_refused_and_an_enabled_one_works_again(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    assert (await mesh.call("echo", headers=key(client))).status == 200
    await mesh.client_action(client["client_id"], "disable")
    assert_refused(await mesh.call("echo", headers=key(client)), 401, "UNAUTHENTICATED")
    await mesh.client_action(client["client_id"], "enable")
    assert (await mesh.call("echo", headers=key(client))).status == 200
    assert agent.calls == 2


async def test_a_rotated_clients_old_api_key_is_refused_and_the_new_one_works(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    assert (await mesh.call("echo", headers=key(client))).status == 200
    rotated = await mesh.client_action(client["client_id"], "rotate")
    assert rotated["api_key"] != client["api_key"]
    assert_refused(await mesh.call("echo", headers=key(client)), 401, "UNAUTHENTICATED")
    assert (await mesh.call("echo", headers=key(rotated))).status == 200
    assert agent.calls == 2


async def test_a_capability_not_granted_is_forbidden_before_its_existence_is_revealed(secure, router_logs):
    mesh, agent = secure
    client = await mesh.new_client(["other.thing"])
    answer = await mesh.call("echo", headers=key(client), request_id="no-grant-1")
    assert_refused(answer, 403, "FORBIDDEN")
    assert client["client_id"] in answer.body["error_message"]
    # A capability nobody offers answers the same as one that exists: FORBIDDEN, not UNKNOWN_CAPABILITY.
    assert_refused(await mesh.call("secret.nothing", headers=key(client)), 403, "FORBIDDEN")
    assert agent.calls == 0
    assert mesh.router.decisions["forbidden"] == 2
    refused = [line for line in router_logs.named("call refused") if line.get("request_id") == "no-grant-1"]
    assert refused and refused[0]["client_id"] == client["client_id"]
    assert refused[0]["error_code"] == "FORBIDDEN" and refused[0]["capability"] == "echo"


async def test_a_prefix_grant_covers_its_names_and_nothing_else(secure, start_agent):
    mesh, _ = secure
    status = await start_agent("order-status")
    await mesh.add(status, "order.status")
    lookalike = await start_agent("orders-x")
    await mesh.add(lookalike, "orders.x")
    client = await mesh.new_client(["order.*"])
    assert (await mesh.call("order.status", headers=key(client))).status == 200
    assert_refused(await mesh.call("orders.x", headers=key(client)), 403, "FORBIDDEN")
    assert_refused(await mesh.call("order", headers=key(client)), 403, "FORBIDDEN")
    assert (status.calls, lookalike.calls) == (1, 0)


async def test_a_bare_star_grant_is_refused_at_client_creation(secure):
    mesh, _ = secure
    body = {"name": "greedy", "trust_level": "internal", "grants": ["*"]}
    async with mesh.http.post(f"{mesh.registry.url}/clients", json=body, headers=mesh.admin) as response:
        assert response.status == 400
        error = await response.json()
    assert error["field"] and "grants" in error["field"]
    assert not mesh.router.mirror.auth.clients


@pytest.mark.parametrize(("held", "required", "allowed"), [
    ("public", None, False),  # a capability that declares nothing requires "internal"
    ("public", "user_authorized", False),
    ("user_authorized", "internal", False),
    ("public", "public", True),
    ("user_authorized", "public", True),
    ("internal", None, True),
])
async def test_the_trust_level_is_checked_before_an_instance_is_selected(secure, start_agent, held, required,
                                                                         allowed):
    mesh, _ = secure
    agent = await start_agent("guarded-1")
    await mesh.add(agent, "guarded", **({"trust_level": required} if required else {}))
    client = await mesh.new_client(["guarded"], trust_level=held)
    answer = await mesh.call("guarded", headers=key(client))
    if allowed:
        assert answer.status == 200, answer.body
        assert agent.calls == 1
    else:
        assert_refused(answer, 403, "TRUST_LEVEL_INSUFFICIENT")
        assert f"requires trust level {required or 'internal'}" in answer.body["error_message"]
        assert agent.calls == 0


async def test_a_client_over_its_rate_gets_429_with_retry_after_and_recovers(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"], rate_limit_qps=1)
    assert (await mesh.call("echo", headers=key(client))).status == 200
    limited = await mesh.call("echo", headers=key(client))
    assert_refused(limited, 429, "BUSY")
    assert int(limited.headers["Retry-After"]) >= 1
    assert mesh.router.decisions["rate_limited"] >= 1
    assert agent.calls == 1
    # Another client is not held back by this one's bucket.
    other = await mesh.new_client(["echo"], name="other", rate_limit_qps=1)
    assert (await mesh.call("echo", headers=key(other))).status == 200

    async def recovered() -> bool:
        return (await mesh.call("echo", headers=key(client))).status == 200
    await wait_for(recovered, timeout=5, interval=0.2, what="the client's bucket to refill")


async def test_the_routers_default_client_rate_applies_when_the_client_names_none(start_mesh, start_agent):
    mesh = await start_mesh(auth=True, router_settings={"client_qps": 1.0})
    await mesh.add(await start_agent("echo-1"), "echo")
    client = await mesh.new_client(["echo"])
    assert (await mesh.call("echo", headers=key(client))).status == 200
    assert_refused(await mesh.call("echo", headers=key(client)), 429, "BUSY")


async def test_json_rpc_calls_are_authenticated_the_same_way(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    envelope = {"jsonrpc": "2.0", "method": "atp.call", "id": 7, "params": {"capability": "echo", "payload": 1}}
    anonymous = await mesh.post(envelope)
    assert anonymous.body["error"]["data"]["error_code"] == "UNAUTHENTICATED"
    batch = await mesh.post([envelope, {**envelope, "id": 8, "params": {"capability": "nope"}}], headers=key(client))
    assert batch.body[0]["result"]["result"]["echo"] == 1
    assert batch.body[1]["error"]["data"]["error_code"] == "FORBIDDEN"
    assert agent.calls == 1


async def test_oversized_headers_are_refused_before_routing(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    fits = await mesh.call("echo", headers={**key(client), "X-Note": "n" * 7000})
    assert fits.status == 200
    for path in ("/atp", "/oauth/token"):
        async with mesh.http.post(f"{mesh.url}{path}", json={"capability": "echo"},
                                  headers={**key(client), "X-Note": "n" * 4000, "X-More": "m" * 4200}) as response:
            body = await response.json()
            assert (response.status, body["error"], body["field"]) == (431, "headers_too_large", "headers"), path
            assert "8192" in body["message"]
    async with mesh.http.post(f"{mesh.url}/atp", json={"capability": "echo"},
                              headers={**key(client), "X-Note": "n" * 40_000}) as response:
        assert response.status == 400, "past aiohttp's own line limit it answers by itself"
    assert agent.calls == 1


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_json_nested_past_the_limit_is_refused_naming_it(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    # The frame object is one level, so a payload of 31 stays within 32.
    assert (await mesh.call("echo", nested(31), headers=key(client))).status == 200
    # Brackets inside strings are not nesting.
    assert (await mesh.call("echo", "[" * 100 + '"{' * 50, headers=key(client))).status == 200
    deep = await mesh.call("echo", nested(32), headers=key(client))
    assert deep.status == 400 and deep.body["error_code"] == "INVALID_FRAME"
    assert "nesting" in deep.body["error_message"] and "32" in deep.body["error_message"]
    raw = await mesh.post(None, raw=b"[" * 5000 + b"]" * 5000, headers=key(client))
    assert raw.status == 400 and "nesting" in raw.body["error_message"]
    assert agent.calls == 2


@pytest.mark.parametrize("path", ["/reach", "/alerts", "/traces", "/traces/abc"])
async def test_operator_endpoints_need_the_admin_key(secure, path):
    mesh, _ = secure
    client = await mesh.new_client(["echo"])
    for headers, status, error in (({}, 401, "unauthenticated"), ({"X-API-Key": "ark_wrong"}, 401, "unauthenticated"),
                                   (key(client), 403, "forbidden")):
        async with mesh.http.get(f"{mesh.url}{path}", headers=headers) as response:
            assert response.status == status
            body = await response.json()
            assert body["error"] == error and body["field"] == "Authorization" and body["message"]
    for admin in ({"X-API-Key": mesh.admin_key}, {"Authorization": f"Bearer {mesh.admin_key}"}):
        async with mesh.http.get(f"{mesh.url}{path}", headers=admin) as response:
            assert response.status == (404 if path == "/traces/abc" else 200)


async def test_health_metrics_jwks_and_completions_stay_open(secure):
    mesh, _ = secure
    for path in ("/healthz", "/metrics", "/.well-known/jwks.json"):
        async with mesh.http.get(f"{mesh.url}{path}") as response:
            assert response.status == 200, path
    async with mesh.http.post(f"{mesh.url}/completions", data=json.dumps({"request_id": "r1"})) as response:
        assert response.status == 200
        assert (await response.json()) == {"request_id": "r1", "known": False}


async def test_with_auth_off_no_credential_is_needed_and_no_token_endpoint_exists(mesh, start_agent):
    await mesh.add(await start_agent("echo-1"), "echo")
    assert (await mesh.call("echo")).status == 200
    async with mesh.http.post(f"{mesh.url}/oauth/token", data={"grant_type": "client_credentials"}) as response:
        assert response.status == 404


async def test_a_fallback_the_caller_may_not_call_is_not_taken(secure, start_agent):
    mesh, _ = secure
    await mesh.put_policy("primary", {"fallback_capability": "backup"})
    primary, backup = await start_agent("primary-1"), await start_agent("backup-1")
    primary.status = 500
    await mesh.add(primary, "primary")
    await mesh.add(backup, "backup", trust_level="public")
    narrow = await mesh.new_client(["primary"], name="narrow")
    answer = await mesh.call("primary", headers=key(narrow))
    assert answer.status == 502 and answer.body["error_code"] == "AGENT_ERROR"
    assert backup.calls == 0 and mesh.router.decisions["fallback_refused"] == 1
    wide = await mesh.new_client(["primary", "backup"], name="wide")
    answer = await mesh.call("primary", headers=key(wide))
    assert answer.status == 200 and answer.route["reason"] == "fallback"
    assert backup.calls == 1


async def test_the_strictest_instance_decides_the_trust_level_and_the_plan_follows_the_feed(secure, start_agent):
    """A call may reach any instance, so it needs the level the strictest one requires; the capability's
    compiled plan (router/plan.py) follows the feed: once that instance leaves, the caller is let through."""
    mesh, _ = secure
    public, guarded = await start_agent("open-1"), await start_agent("guarded-1")
    await mesh.add(public, "mixed", trust_level="public")
    await mesh.add(guarded, "mixed", trust_level="internal")
    client = await mesh.new_client(["mixed"], trust_level="user_authorized")
    refused = await mesh.call("mixed", headers=key(client))
    assert_refused(refused, 403, "TRUST_LEVEL_INSUFFICIENT")
    assert "requires trust level internal" in refused.body["error_message"]
    internal = await mesh.new_client(["mixed"], name="inside")
    assert (await mesh.call("mixed", headers=key(internal))).status == 200
    await mesh.deregister("guarded-1")
    await wait_for(lambda: len(mesh.router.mirror.offers("mixed") or []) == 1, timeout=5,
                   what="the router to see guarded-1 leave")
    answer = await mesh.call("mixed", headers=key(client))
    assert answer.status == 200, answer.body
    assert answer.body["route"]["instance"] == "open-1"
    assert guarded.calls + public.calls == 2  # the refused call reached neither


async def test_a_policy_change_reaches_the_next_call(secure):
    """The plan holds the resolved policy: a stored change must not wait for anything but the feed."""
    mesh, _ = secure
    client = await mesh.new_client(["echo"])
    before = await mesh.call("echo", headers=key(client))
    assert before.body["route"]["policy"] == "least_load"
    await mesh.put_policy("echo", {"policy": "hash"})
    after = await mesh.call("echo", headers=key(client))
    assert after.status == 200, after.body
    assert after.body["route"]["policy"] == "hash"
