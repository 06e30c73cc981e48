"""context.routing_hint is a hard filter, so a hint that is no object is refused at the edge, never dropped."""

from __future__ import annotations

import pytest

from router_support import Mesh

NOT_OBJECTS = ["zone=eu", ["zone", "eu"], 5, True]


@pytest.mark.parametrize("hint", NOT_OBJECTS)
async def test_a_hint_that_is_no_object_is_refused_naming_the_field(mesh: Mesh, start_agent, hint):
    agent = await start_agent("hinted")
    await mesh.add(agent, metadata={"zone": "eu"})
    answer = await mesh.call(payload=1, context={"routing_hint": hint}, request_id="hint-1")
    assert (answer.status, answer.body["error_code"], answer.body["field"]) == \
        (400, "INVALID_FRAME", "context.routing_hint")
    assert answer.body["request_id"] == "hint-1" and answer.body["can_retry"] is False
    assert agent.calls == 0


async def test_a_hint_that_is_no_object_is_refused_over_json_rpc_too(mesh: Mesh, start_agent):
    agent = await start_agent("hinted")
    await mesh.add(agent, metadata={"zone": "eu"})
    answer = await mesh.post({"jsonrpc": "2.0", "method": "atp.call", "id": 1,
                              "params": {"capability": "echo", "payload": 1, "context": {"routing_hint": "eu"}}})
    data = answer.body["error"]["data"]
    assert (data["error_code"], data["field"]) == ("INVALID_FRAME", "context.routing_hint")
    assert agent.calls == 0


@pytest.mark.parametrize("hint", [None, {}])
async def test_a_null_or_empty_hint_asks_for_nothing(mesh: Mesh, start_agent, hint):
    agent = await start_agent("hinted")
    await mesh.add(agent, metadata={"zone": "eu"})
    answer = await mesh.call(payload=1, context={"routing_hint": hint})
    assert answer.status == 200 and agent.calls == 1


async def test_an_object_hint_still_filters(mesh: Mesh, start_agent):
    agent = await start_agent("hinted")
    await mesh.add(agent, metadata={"zone": "eu"})
    assert (await mesh.call(payload=1, context={"routing_hint": {"zone": "eu"}})).status == 200
    refused = await mesh.call(payload=1, context={"routing_hint": {"zone": "us"}})
    assert (refused.status, refused.body["error_code"]) == (503, "ROUTING_HINT_UNSATISFIABLE")
    assert agent.calls == 1


async def test_a_boolean_hint_is_not_the_number_one(mesh: Mesh, start_agent):
    """Python's True == 1 once let {"gpu": true} through to an instance labelled gpu=1 (and 1 to one labelled
    true); JSON, and the Go SDK, tell them apart."""
    counted = await start_agent("counted")
    await mesh.add(counted, metadata={"gpu": 1})
    for hint in ({"gpu": True}, {"gpu": False}):
        refused = await mesh.call(payload=1, context={"routing_hint": hint})
        assert (refused.status, refused.body["error_code"]) == (503, "ROUTING_HINT_UNSATISFIABLE"), hint
    assert (await mesh.call(payload=1, context={"routing_hint": {"gpu": 1.0}})).status == 200
    assert counted.calls == 1
