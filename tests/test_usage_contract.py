"""The usage contract: what an agent's usage report is read as, what a call costs at an instance's prices,
and prices in the registration (checked at the registry's edge, stored without changing older records)."""

from __future__ import annotations

import msgspec
import pytest
from agent_reach.atp import ResponseFrame
from agent_reach.registration import Capability
from agent_reach.usage import Usage, call_cost, priced, usage_from

from conftest import post
from mesh.records import InstanceRecord, decode_value, encode_value, instance_key


@pytest.mark.parametrize(("raw", "read"), [
    ({"input_tokens": 12, "output_tokens": 30}, Usage(input_tokens=12, output_tokens=30)),
    ({"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}, Usage(input_tokens=12, output_tokens=30)),
    ({"output_tokens": 5}, Usage(output_tokens=5)),
    ({"input_tokens": 1, "prompt_tokens": 99}, Usage(input_tokens=1)),  # the mesh's own name wins
    ({"input_tokens": 0, "output_tokens": 0}, Usage()),
])
def test_usage_is_read_under_the_meshs_names_or_openais(raw, read):
    assert usage_from(raw) == read


@pytest.mark.parametrize("raw", [
    None, "12 tokens", 12, [12, 30], {}, {"total_tokens": 42},
    {"input_tokens": -1}, {"input_tokens": "12"}, {"input_tokens": 1.5}, {"output_tokens": True},
    {"input_tokens": 2**53}, {"input_tokens": 3, "output_tokens": None},
])
def test_a_usage_that_is_absent_or_garbled_is_dropped_whole(raw):
    assert usage_from(raw) is None


def _cap(**prices: float) -> Capability:
    return Capability(name="llm", endpoint="http://127.0.0.1:9/x", **prices)


def test_cost_is_per_call_plus_tokens_at_their_per_thousand_prices():
    capability = _cap(cost_per_call=0.5, cost_per_1k_input_tokens=2.0, cost_per_1k_output_tokens=8.0)
    assert call_cost(capability, Usage(input_tokens=500, output_tokens=250)) == 0.5 + 1.0 + 2.0
    assert call_cost(capability, None) == 0.5  # the call's price is due without token counts
    assert call_cost(_cap(cost_per_1k_output_tokens=4.0), Usage(input_tokens=1000, output_tokens=500)) == 2.0
    assert call_cost(_cap(cost_per_1k_input_tokens=4.0), None) == 0.0
    assert call_cost(_cap(), Usage(input_tokens=10)) is None  # no price declared: no cost
    assert call_cost(_cap(cost_per_call=0), None) == 0.0  # a free instance is priced, at zero


def test_the_answered_usage_carries_the_cost_and_nothing_is_built_without_usage_or_price():
    assert priced(_cap(), None) is None
    assert priced(None, None) is None
    assert priced(_cap(), Usage(input_tokens=3)) == Usage(input_tokens=3)
    assert priced(_cap(cost_per_call=0.25), None) == Usage(cost=0.25)
    assert priced(_cap(cost_per_1k_input_tokens=1.0), Usage(input_tokens=2000)) == Usage(input_tokens=2000, cost=2.0)


def test_a_response_frame_carries_usage_on_the_wire_and_leaves_it_out_when_absent():
    frame = ResponseFrame(request_id="r", status="success", usage=Usage(input_tokens=1, output_tokens=2, cost=0.5))
    encoded = msgspec.json.encode(frame)
    assert msgspec.json.decode(encoded)["usage"] == {"input_tokens": 1, "output_tokens": 2, "cost": 0.5}
    assert msgspec.json.decode(encoded, type=ResponseFrame) == frame
    assert b"usage" not in msgspec.json.encode(ResponseFrame(request_id="r", status="success"))


def test_prices_are_stored_when_given_and_a_record_without_them_keeps_its_bytes():
    plain = InstanceRecord(agent_id="a-1", service="svc", health_url="http://127.0.0.1:9/healthz",
                           capabilities=[_cap()])
    assert b"cost_per" not in encode_value(plain)
    with_prices = msgspec.structs.replace(plain, capabilities=[_cap(cost_per_call=1.5, cost_per_1k_input_tokens=0)])
    stored = encode_value(with_prices)
    assert decode_value(instance_key("a-1"), stored) == with_prices


def _registration(**prices: object) -> dict[str, object]:
    capability = {"name": "llm.chat", "protocol": "rest", "endpoint": "http://127.0.0.1:9/x", **prices}
    return {"agent_id": "a1", "capabilities": [capability]}


@pytest.mark.parametrize("field", ["cost_per_call", "cost_per_1k_input_tokens", "cost_per_1k_output_tokens"])
async def test_a_negative_price_is_refused_naming_the_field_and_nothing_is_stored(registry, http, field):
    status, answer = await post(http, f"{registry.url}/register", _registration(**{field: -0.01}))
    assert status == 400, answer
    assert (answer["error"], answer["field"]) == ("invalid_field", f"capabilities[0].{field}")
    assert answer["message"]
    assert registry.store.revision == 0


async def test_a_price_that_is_no_number_is_refused_and_a_good_one_is_registered(registry, http):
    status, answer = await post(http, f"{registry.url}/register", _registration(cost_per_call="cheap"))
    assert (status, answer["field"]) == (400, "capabilities[0].cost_per_call")
    status, answer = await post(http, f"{registry.url}/register",
                                _registration(cost_per_call=0.002, cost_per_1k_output_tokens=0.06))
    assert status == 200, answer
    async with http.get(f"{registry.url}/agents/a1") as response:
        stored = (await response.json())["capabilities"][0]
    assert (stored["cost_per_call"], stored["cost_per_1k_output_tokens"]) == (0.002, 0.06)
    assert "cost_per_1k_input_tokens" not in stored
