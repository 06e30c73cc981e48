"""Routing policies live in the registry: validated, written to the WAL, readable back."""

from __future__ import annotations

import pytest

SEED_POLICY = {
    "capability": "intent.detect", "policy": "least_load",
    "affinity": {"enabled": True, "key": "session_id", "ttl_seconds": 300},
    "timeout": {"connect_ms": 200, "first_byte_ms": 2000, "total_ms": 10000},
    "retry": {"enabled": False},
    "circuit_breaker": {"error_threshold_percent": 30, "min_requests": 30, "reset_seconds": 30},
}


async def put(http, url, body):
    async with http.put(url, json=body) as response:
        return response.status, await response.json()


async def test_seed_policy_round_trip_and_survives_restart(start_registry, http, tmp_path):
    data_dir = tmp_path / "policies"
    registry = await start_registry(data_dir)
    status, body = await put(http, f"{registry.url}/policies/intent.detect", SEED_POLICY)
    assert status == 200 and body["policy"] == "least_load" and body["timeout"]["first_byte_ms"] == 2000
    assert registry.store.revision == 1
    async with http.get(f"{registry.url}/policies/intent.detect") as response:
        assert response.status == 200 and (await response.json())["affinity"]["ttl_seconds"] == 300
    await registry.stop()
    restarted = await start_registry(data_dir)
    async with http.get(f"{restarted.url}/policies") as response:
        policies = (await response.json())["policies"]
    assert [p["capability"] for p in policies] == ["intent.detect"]
    async with http.delete(f"{restarted.url}/policies/intent.detect") as response:
        assert response.status == 200
    async with http.get(f"{restarted.url}/policies/intent.detect") as response:
        assert response.status == 404 and (await response.json())["error"] == "policy_not_found"


@pytest.mark.parametrize(("body", "code", "field"), [
    ({"policy": "random"}, "invalid_field", "policy"),
    ({"timeout": {"connect_ms": -5}}, "invalid_field", "timeout.connect_ms"),
    ({"timeout": {"connect_ms": 500, "first_byte_ms": 100}}, "invalid_policy", "timeout.connect_ms"),
    ({"circuit_breaker": {"error_threshold_percent": 150}}, "invalid_field", "circuit_breaker.error_threshold_percent"),
    ({"retry": {"enabled": True, "max_attempts": 99}}, "invalid_field", "retry.max_attempts"),
    ({"fallback_capability": "intent.detect"}, "invalid_policy", "fallback_capability"),
    ({"capability": "other.cap"}, "invalid_policy", "capability"),
    ({"colour": "red"}, "unknown_field", "colour"),
])
async def test_bad_policy_is_rejected_and_not_logged(registry, http, body, code, field):
    status, answer = await put(http, f"{registry.url}/policies/intent.detect", body)
    assert status == 400 and answer["error"] == code and answer["field"] == field, answer
    assert registry.store.revision == 0


async def test_bad_capability_name_in_path(registry, http):
    status, answer = await put(http, f"{registry.url}/policies/bad%20name", {"policy": "hash"})
    assert status == 400 and answer["field"] == "capability"
