"""The shared vectors (tests/vectors/*.json) through the Python SDK's own functions: the contract the Go SDK is
held to byte for byte, so each vector must first be what the Python SDK does. Every section of every file is
checked (test_every_section_is_checked fails on a section no test reads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agent_reach import peer_json
from agent_reach.agent import AgentReachSDK
from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame, ResponseFrame
from agent_reach.context import CallContext, incoming_context, outgoing_context
from agent_reach.dispatch import Dispatcher, LateCompletion, Native
from agent_reach.guard import CallGuard
from agent_reach.headers import REQUEST_ID_HEADER, TRACEPARENT_HEADER
from agent_reach.hint import matches_hint
from agent_reach.inflight import Inflight
from agent_reach.registration import Capability
from agent_reach.signing import sign, signing_key, verify
from agent_reach.sse import EventParser, chunk_event
from agent_reach.transport import decode_atp, decode_rest

VECTORS = Path(__file__).parent / "vectors"
# The sections each file's tests read, filled in as the parameters are built.
CHECKED: dict[str, set[str]] = {}


def _load(name: str) -> dict[str, Any]:
    """A vector file with its members in written order (msgspec keeps it), ints and floats apart."""
    loaded: dict[str, Any] = msgspec.json.decode((VECTORS / f"{name}.json").read_bytes())
    return loaded


def cases(name: str, section: str, label: Callable[[Any], object]) -> list[Any]:
    """One pytest param per vector of ``section``, its id the index and ``label``; the section counts as checked."""
    CHECKED.setdefault(name, set()).add(section)
    return [pytest.param(vector, id=f"{index}-{label(vector)}") for index, vector in enumerate(_load(name)[section])]


def exact(value: Any) -> bytes:
    """A JSON value's canonical bytes: member order ignored, types not (1, 1.0 and true differ)."""
    return msgspec.json.encode(value, order="sorted")


def outcome(answer: dict[str, Any]) -> object:
    return answer.get("error_code") or answer.get("status")


def test_every_section_is_checked() -> None:
    for path in sorted(VECTORS.glob("*.json")):
        vectors = _load(path.stem)
        sections = set(vectors) - {"about"}
        assert sections == CHECKED.get(path.stem), f"{path.name}: sections without a test"
        assert all(vectors[section] for section in sections), f"{path.name}: an empty section checks nothing"


# frames.json


FRAMES: dict[str, type[msgspec.Struct]] = {"requests": RequestFrame, "responses": ResponseFrame, "errors": ErrorFrame}


def _frame_label(encoded: str) -> object:
    frame = peer_json.decode(encoded)
    return frame.get("capability") or frame.get("error_code") or frame["status"]


def frame_cases() -> list[Any]:
    return [pytest.param(FRAMES[section], *param.values, id=f"{section}-{param.id}") for section in FRAMES
            for param in cases("frames", section, _frame_label)]


@pytest.mark.parametrize(("frame", "encoded"), frame_cases())
def test_frame_round_trip(frame: type[msgspec.Struct], encoded: str) -> None:
    decoded = peer_json.decode(encoded.encode(), type=frame)
    assert msgspec.json.encode(decoded) == encoded.encode()


@pytest.mark.parametrize("vector", cases("frames", "atp_answers", lambda v: f"{v['status']}-{outcome(v['expected'])}"))
def test_atp_answer(vector: dict[str, Any]) -> None:
    answer = decode_atp(vector["request_id"], vector["status"], vector["body"].encode())
    assert msgspec.json.encode(answer) == msgspec.json.encode(vector["expected"])


@pytest.mark.parametrize("vector", cases("frames", "rest_answers", lambda v: f"{v['status']}-{outcome(v['expected'])}"))
def test_rest_answer(vector: dict[str, Any]) -> None:
    answer = decode_rest(vector["request_id"], vector["status"], vector["body"].encode())
    assert msgspec.json.encode(answer) == msgspec.json.encode(vector["expected"])


@pytest.mark.parametrize("vector", cases("frames", "chunk_events", lambda v: f"seq{v['seq']}"))
def test_chunk_event(vector: dict[str, Any]) -> None:
    event = chunk_event(vector["request_id"], vector["seq"], msgspec.Raw(vector["data"].encode()))
    assert event == vector["event"].encode()


@pytest.mark.parametrize("vector", cases("frames", "event_streams", lambda v: f"{len(v['events'])}-events"))
def test_event_stream(vector: dict[str, Any]) -> None:
    parser = EventParser()
    events = [event for piece in vector["pieces"] for event in parser.feed(piece.encode())]
    assert [(event.name, event.data) for event in events] == [
        (expected["name"], expected["data"].encode()) for expected in vector["events"]]


# signatures.json


@pytest.mark.parametrize("vector", cases("signatures", "keys", lambda v: v["key"][:8]))
def test_signing_key(vector: dict[str, Any]) -> None:
    assert signing_key(vector["token"]) == vector["key"]


@pytest.mark.parametrize("vector", cases("signatures", "signatures", lambda v: f"{v['agent_id']}-t{v['now']}"))
def test_signature(vector: dict[str, Any]) -> None:
    header = sign(vector["key"], vector["agent_id"], vector["method"], vector["path"], vector["request_id"],
                  vector["body"].encode(), now=vector["now"], nonce=vector["nonce"])
    assert header == vector["header"]


@pytest.mark.parametrize("vector", cases("signatures", "verifications", lambda v: v["name"]))
def test_verification(vector: dict[str, Any]) -> None:
    reason = verify(vector["header"], vector["key"], vector["agent_id"], vector["method"], vector["path"],
                    vector["request_id"], vector["body"].encode(), now=vector["now"], window_s=vector["window_s"])
    assert reason == vector["reason"]


# error_codes.json


@pytest.mark.parametrize("vector", cases("error_codes", "codes", lambda v: v["code"]))
def test_error_code(vector: dict[str, Any]) -> None:
    code = ErrorCode(vector["code"])
    assert (code.http_status, code.can_retry) == (vector["http_status"], vector["can_retry"])


def test_error_codes_listed_once_each() -> None:
    listed = [vector["code"] for vector in _load("error_codes")["codes"]]
    assert sorted(listed) == sorted(code.value for code in ErrorCode)


# contexts.json


def _refuse_late(url: str, notice: LateCompletion) -> None:
    raise AssertionError(f"no call here finishes late: {url} {notice}")


@pytest.mark.parametrize("vector", cases("contexts", "outgoing", lambda v: "+".join(v["explicit"]) or "inherited"))
async def test_outgoing_context(vector: dict[str, Any]) -> None:
    """The handler does what the vector says, then makes a nested call's context; the dispatcher answers the
    call. A ``report_usage`` of [0, 0] is a handler that reports nothing (reporting zeros sends a usage)."""
    agent_id, name = "ctx-agent", "ctx.probe"

    async def handler(payload: Any, call: CallContext) -> Any:
        call.update_context(**vector["context_update"])
        if any(vector["report_usage"]):
            call.report_usage(*vector["report_usage"])
        call.spent_by_callee(vector["spent_by_callee"])
        return outgoing_context(vector["explicit"])

    capability = msgspec.convert({"name": name, "endpoint": f"/atp/{name}"}, Capability)
    dispatcher = Dispatcher(agent_id, Inflight(4), _refuse_late, CallGuard(agent_id, None, False))
    frame = RequestFrame(capability=name, context=vector["context"], request_id=vector["request_id"])
    reply = await dispatcher.handle(Native(capability, handler), name, msgspec.json.encode(frame),
                                    {REQUEST_ID_HEADER: vector["request_id"]})
    assert reply.status == 200, reply.body
    answer = msgspec.json.decode(reply.body, type=ResponseFrame)
    assert exact(answer.result) == exact(vector["outgoing"])
    assert exact(answer.context_update) == exact(vector["answer_context_update"])
    assert exact(answer.usage) == exact(vector["usage"])


@pytest.mark.parametrize("vector", cases("contexts", "incoming",
                                   lambda v: str(v["expected"].get("trace_id", "no-trace"))[:8]))
def test_incoming_context(vector: dict[str, Any]) -> None:
    context = incoming_context(vector["context"], {TRACEPARENT_HEADER: vector["traceparent"]})
    assert exact(context) == exact(vector["expected"])


@pytest.mark.parametrize("vector", cases("contexts", "routing_hints",
                                   lambda v: f"{'+'.join(v['routing_hint']) or 'empty'}-{v['matches']}"))
def test_routing_hint(vector: dict[str, Any]) -> None:
    assert matches_hint(vector["metadata"], vector["routing_hint"]) is vector["matches"]


# agents.json


async def _probe(payload: Any, call: CallContext) -> Any:
    return payload


@pytest.mark.parametrize("vector", cases("agents", "heartbeats", lambda v: f"{v['in_flight']}of{v['max_inflight']}"))
async def test_heartbeat(vector: dict[str, Any]) -> None:
    sdk = AgentReachSDK(vector["agent_id"], "http://127.0.0.1:9", zone="z", max_inflight=vector["max_inflight"])
    if vector["health_failure"] is not None:
        @sdk.health_check
        def failing() -> bool:
            raise RuntimeError(vector["health_failure"])
    for index in range(vector["in_flight"]):
        sdk.inflight.enter(f"call-{index}", "probe")
    for ended, tokens in vector["outcomes"]:
        sdk.inflight.count_outcome(ended, tokens)
    assert msgspec.json.encode(await sdk.heartbeat()) == vector["encoded"].encode()


@pytest.mark.parametrize("vector", cases("agents", "registrations", lambda v: v["agent_id"]))
def test_registration(vector: dict[str, Any]) -> None:
    sdk = AgentReachSDK(vector["agent_id"], "http://127.0.0.1:9", zone=vector["zone"], service=vector["service"],
                        metadata=vector["metadata"], base_url=vector["base_url"],
                        direct_fallback=vector["direct_fallback"])
    for declared in vector["capabilities"]:
        sdk.capability(**declared)(_probe)
    assert exact(sdk.registration()) == exact(vector["expected"])
