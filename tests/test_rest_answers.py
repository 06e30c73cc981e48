"""How the router reads a rest agent's whole answer (router/transports/rest.py ``RestDialect.classify``): the
answer passed on byte for byte, its top-level ``usage`` and ``business_error`` read, anything that is not
JSON refused as the agent's fault, whatever the answer's shape or size."""

from __future__ import annotations

import json

import msgspec
import pytest
from agent_reach.atp import ErrorCode
from agent_reach.usage import Usage

from router.transports.rest import RestDialect

classify = RestDialect().classify
USAGE = {"input_tokens": 12, "output_tokens": 5}


@pytest.mark.parametrize("answer", [
    {"text": "a" * 5000},
    {"text": "the usage of agents " * 300, "nested": {"usage": USAGE, "business_error": {"code": "X"}}},
    [1, {"usage": USAGE}],
    "a plain string with \"usage\" in it",
    3.5,
    None,
    {"business_error": None, "result": 1},
    {"名前": "値", "emoji": "🎉"},
])
def test_an_answer_without_top_level_members_passes_through_untouched(answer):
    body = json.dumps(answer, ensure_ascii=False).encode()
    found = classify(200, body)
    assert found.error_code is None, found.message
    assert bytes(found.result) == body and found.usage is None


def test_surrounding_whitespace_is_not_part_of_the_value():
    found = classify(200, b' \n{"a": 1}\r\n\t')
    assert bytes(found.result) == b'{"a": 1}'


def test_top_level_usage_is_read_and_the_answer_still_passed_through():
    body = json.dumps({"answer": "ok", "usage": USAGE, "text": "usage " * 500}).encode()
    found = classify(200, body)
    assert bytes(found.result) == body
    assert found.usage == Usage(input_tokens=12, output_tokens=5)
    # The last of two members of one name counts, as any JSON reader of objects into maps has it.
    twice = classify(200, b'{"usage": {"input_tokens": 1}, "usage": {"input_tokens": 7}}')
    assert twice.usage == Usage(input_tokens=7)


def test_a_top_level_business_error_is_the_agents_business_answer():
    body = {"business_error": {"code": "OUT_OF_STOCK", "message": "none left"}, "usage": USAGE}
    found = classify(200, json.dumps(body).encode())
    assert found.error_code is ErrorCode.BUSINESS_ERROR and found.message == "none left"
    assert found.business_error.code == "OUT_OF_STOCK" and found.result == body
    assert classify(200, b'{"business_error": 7}').business_error.code == "7"  # a bare code, as agents send it
    assert classify(200, b'{"business_error": true}').error_code is ErrorCode.AGENT_ERROR


def test_an_empty_body_is_a_null_result():
    found = classify(200, b"")
    assert found.error_code is None and found.result is None


@pytest.mark.parametrize("body", [
    b'{"a": 1',  # cut short
    b'{"a": 1} x',  # trailing data
    b'[1, 2,]',  # an array with a syntax error after a valid start
    b'{"skipped": "\xff\xfe", "usage": null}',  # invalid UTF-8 in a member the reader skips
    b'{"usage": {"input_tokens": 1}, "x": [1, 2}',  # a syntax error after the members read
    b"   ",
    b"\xef\xbb\xbf{}",  # a byte order mark is not JSON
])
def test_anything_that_is_not_json_is_the_agents_error(body):
    found = classify(200, body)
    assert found.error_code is ErrorCode.AGENT_ERROR and "not JSON" in found.message


def test_a_failed_status_is_not_read():
    assert classify(503, b'{"usage": {"input_tokens": 1}}').error_code is not None


def test_an_answer_nested_past_the_limit_is_refused_before_it_is_read():
    found = classify(200, b"[" * 100 + b"]" * 100)
    assert found.error_code is ErrorCode.AGENT_ERROR


def test_a_large_answer_is_read_whole():
    body = msgspec.json.encode({"rows": [{"id": i, "usage": "x"} for i in range(20_000)], "usage": USAGE})
    found = classify(200, body)
    assert bytes(found.result) == body and found.usage == Usage(input_tokens=12, output_tokens=5)
