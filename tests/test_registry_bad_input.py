"""Every class of bad input gets a 4xx JSON body naming code, message and field, and changes nothing."""

from __future__ import annotations

import pytest

from conftest import post, registration


def _cap(**overrides):
    return {"name": "good.cap", "protocol": "rest", "endpoint": "http://127.0.0.1:9/x", **overrides}


def _body(**overrides):
    return {"agent_id": "a1", "capabilities": [_cap()], "metadata": {"zone": "z"}, **overrides}


CASES = [
    ("wrong type in capability", _body(capabilities=[_cap(timeout_sla_ms="fast")]),
     "invalid_field", "capabilities[0].timeout_sla_ms"),
    ("missing agent_id", {"capabilities": [_cap()]}, "missing_field", "agent_id"),
    ("missing capability name", _body(capabilities=[{"endpoint": "http://127.0.0.1:9/x"}]),
     "missing_field", "capabilities[0].name"),
    ("unknown top-level field", _body(colour="blue"), "unknown_field", "colour"),
    ("unknown capability field", _body(capabilities=[_cap(speed=3)]), "unknown_field", "capabilities[0].speed"),
    ("empty agent_id", _body(agent_id=""), "invalid_field", "agent_id"),
    ("empty capability name", _body(capabilities=[_cap(name="")]), "invalid_field", "capabilities[0].name"),
    ("name with spaces", _body(capabilities=[_cap(name="two words")]), "invalid_field", "capabilities[0].name"),
    ("no capabilities", _body(capabilities=[]), "invalid_field", "capabilities"),
    ("unknown protocol", _body(capabilities=[_cap(protocol="carrier-pigeon")]),
     "invalid_field", "capabilities[0].protocol"),
    ("negative sla", _body(capabilities=[_cap(timeout_sla_ms=-1)]), "invalid_field", "capabilities[0].timeout_sla_ms"),
    ("endpoint not a URL", _body(capabilities=[_cap(endpoint="not a url")]),
     "invalid_url", "capabilities[0].endpoint"),
    ("endpoint with other scheme", _body(capabilities=[_cap(endpoint="ftp://127.0.0.1/x")]),
     "invalid_url", "capabilities[0].endpoint"),
    ("relative endpoint without base_url", _body(capabilities=[_cap(endpoint="/x")]),
     "invalid_url", "capabilities[0].endpoint"),
    ("broken base_url", _body(base_url="http://[::1", capabilities=[_cap(endpoint="/x")]), "invalid_url", "base_url"),
    ("broken health_url", _body(health_url="http//nohost"), "invalid_url", "health_url"),
    ("max_qps not a number", _body(metadata={"max_qps": "lots"}), "invalid_field", "metadata.max_qps"),
    ("unknown routing policy", _body(metadata={"routing_policy": "random"}),
     "invalid_field", "metadata.routing_policy"),
    ("nested metadata value", _body(metadata={"labels": {"a": 1}}), "invalid_field", "metadata"),
    ("metadata integer past 64 bits", _body(metadata={"shards": 2**64}), "invalid_field", "metadata"),
    ("metadata integer below -2^63", _body(metadata={"shards": -(2**63) - 1}), "invalid_field", "metadata"),
    ("body is a list", [1, 2], "invalid_field", None),
]


@pytest.mark.parametrize(("what", "body", "code", "field"), CASES, ids=[case[0] for case in CASES])
async def test_bad_registration_is_rejected_and_not_logged(registry, http, what, body, code, field):
    status, answer = await post(http, f"{registry.url}/register", body)
    assert status == 400, answer
    assert answer["error"] == code
    assert answer["message"]
    assert answer["field"] == field or (field == "metadata" and answer["field"].startswith("metadata"))
    assert registry.store.revision == 0
    assert registry.store.wal.last_index == 0


@pytest.mark.parametrize("raw", [b"{", b"not json", b"", b'{1: 2}', b'{,}', b"\xff\xfe"])
async def test_malformed_json_is_400(registry, http, raw):
    for path in ("/register", "/heartbeat", "/deregister", "/query"):
        async with http.post(f"{registry.url}{path}", data=raw,
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            assert (await response.json())["error"] == "invalid_json"
    assert registry.store.revision == 0


@pytest.mark.parametrize(("body", "field"), [
    ({"agent_id": "a1", "load": 1.5}, "load"),
    ({"agent_id": "a1", "load": "high"}, "load"),
    ({"agent_id": "a1", "inflight": -1}, "inflight"),
    ({"agent_id": "a1", "sent_at": 1700000000}, "sent_at"),
    ({"load": 0.1}, "agent_id"),
    ({"agent_id": "a1", "inflight": 2**64}, "inflight"),
    ({"agent_id": "a1", "metrics": {"queue": 2**64}}, "metrics[...]"),
])
async def test_bad_heartbeat_is_400(registry, http, body, field):
    await post(http, f"{registry.url}/register", registration("a1", "hb.cap"))
    status, answer = await post(http, f"{registry.url}/heartbeat", body)
    assert status == 400 and answer["field"] == field
    assert registry.registry.agent("a1").state == "pending"


async def test_oversized_body_is_413_and_server_keeps_serving(start_registry, http):
    registry = await start_registry(max_body=4096)
    huge = registration("a1", "big.cap")
    huge["capabilities"][0]["description"] = "x" * 4000
    huge["metadata"]["padding"] = "y" * 4000
    status, answer = await post(http, f"{registry.url}/register", huge)
    assert status == 413 and answer["error"] == "payload_too_large"
    assert registry.store.revision == 0
    status, _ = await post(http, f"{registry.url}/register", registration("a1", "small.cap"))
    assert status == 200
