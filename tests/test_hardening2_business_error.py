"""The business_error shapes agents send, as callers get them: a numeric code (``{"code": 5}``) is a BUSINESS_ERROR
whose code is kept as its JSON text ("5"), as are a bare code and a null message; a code that is a boolean, null or
missing, a message that is no string, or a business_error of another shape is the agent's malformed answer
(AGENT_ERROR naming business_error), never a 500. A real router, scripted rest and ATP agents on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from agent_reach import ReachClient
from agent_reach.client import ReachError
from agent_reach.transport import decode_rest

from agent_support import answered


def answer_carrying(protocol: str, business_error: Any) -> bytes:
    if protocol == "atp":
        return msgspec.json.encode({"request_id": "r", "status": "error", "business_error": business_error})
    return msgspec.json.encode({"text": "partial", "business_error": business_error})


PROTOCOLS = pytest.mark.parametrize("protocol", ["atp", "rest"])


@PROTOCOLS
@pytest.mark.parametrize(("sent", "kept", "message"), [
    ({"code": 5}, {"code": "5"}, "5"),
    ({"code": 5, "message": "out of stock", "details": {"sku": "a-1"}},
     {"code": "5", "message": "out of stock", "details": {"sku": "a-1"}}, "out of stock"),
    ({"code": -2.5, "message": None}, {"code": "-2.5"}, "-2.5"),
    ({"code": "OUT_OF_STOCK"}, {"code": "OUT_OF_STOCK"}, "OUT_OF_STOCK"),
    ("OUT_OF_STOCK", {"code": "OUT_OF_STOCK"}, "OUT_OF_STOCK"),
    (404, {"code": "404"}, "404"),
])
async def test_a_business_error_with_a_code_is_a_business_error(mesh, start_scripted, protocol, sent, kept,
                                                                message) -> None:
    answer = await answered(mesh, start_scripted, "biz.cap", answer_carrying(protocol, sent), protocol)
    assert (answer.status, answer.body["error_code"], answer.body["can_retry"]) == (422, "BUSINESS_ERROR", False), \
        answer.body
    assert (answer.body["business_error"], answer.body["error_message"]) == (kept, message)
    assert answer.route["attempts"] == 1, "a business error is the same on every instance: never failed over"


@PROTOCOLS
@pytest.mark.parametrize("sent", [
    {"code": True}, {"code": None}, {"message": "no code"}, {"code": "E1", "message": 7}, {"code": [5]},
    ["E1"], True, False,
])
async def test_a_business_error_of_another_shape_is_the_agents_malformed_answer(mesh, start_scripted, protocol,
                                                                                sent) -> None:
    answer = await answered(mesh, start_scripted, "bad.biz", answer_carrying(protocol, sent), protocol)
    assert (answer.status, answer.body["error_code"]) == (502, "AGENT_ERROR"), answer.body
    assert "malformed" in answer.body["error_message"] and "business_error" in answer.body["error_message"]


async def test_an_sdk_caller_reads_the_numeric_code_as_text(mesh, start_scripted) -> None:
    agent = await start_scripted("biz-sdk-1")
    agent.body = answer_carrying("rest", {"code": 5, "message": "out of stock"})
    await mesh.add(agent, "biz.sdk")
    async with ReachClient(mesh.url) as client:
        with pytest.raises(ReachError) as raised:
            await client.call("biz.sdk", {"q": 1})
    failure = raised.value.business_error
    assert failure is not None and (failure.code, failure.message) == ("5", "out of stock")


def test_the_sdk_reads_a_rest_agents_numeric_code_as_the_router_does() -> None:
    """The SDK's direct calls (no router) read a rest answer with the router's rules."""
    frame = decode_rest("r", 200, b'{"business_error": {"code": 5}}')
    assert frame.business_error is not None and frame.business_error.code == "5"
    refused = decode_rest("r", 200, b'{"business_error": {"code": true}}')
    assert getattr(refused, "error_code", None) == "AGENT_ERROR"
