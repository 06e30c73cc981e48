"""The router's own OTLP/protobuf (router/otlp_wire.py) against the SDK's encoder: for the same spans and
resource, both decode to equal ExportTraceServiceRequests (opentelemetry-proto's messages compared field by
field), whatever the attribute types, parents, statuses and ids."""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

import pytest
from agent_reach.atp import ErrorCode
from agent_reach.usage import Usage
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from router import otlp_wire
from router.otel import ExportedCall
from router.otel_exporter import attempt_attributes, call_spans, route_attributes, route_facts, usage_attributes
from router.otlp_wire import CLIENT, SERVER, RequestWriter, span, span_attributes, span_shape
from router.traces import AttemptTrace
from weblayer.otel import SCOPE

KINDS = {SERVER: SpanKind.SERVER, CLIENT: SpanKind.CLIENT}
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
RESOURCE = Resource.create({"service.name": "agentreach-router", "deployment.environment": "test",
                            "host.cores": 2, "process.pid": -7, "load": 0.25, "canary": False,
                            "process.command_args": ("agentreach", "router"), "weights": (1.5, -2.0)})


def parsed(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


class Written(NamedTuple):
    """One span as the test describes it: what both encoders are given."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    parent_is_remote: bool
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None


def sdk_span(written: Written) -> ReadableSpan:
    """The same span as the SDK's exporter is handed one."""
    trace_id = int(written.trace_id, 16)
    parent = None if written.parent_span_id is None else SpanContext(
        trace_id, int(written.parent_span_id, 16), is_remote=written.parent_is_remote, trace_flags=SAMPLED)
    status = Status(StatusCode.UNSET) if written.error is None else Status(StatusCode.ERROR, written.error)
    return ReadableSpan(written.name,
                        SpanContext(trace_id, int(written.span_id, 16), is_remote=False, trace_flags=SAMPLED),
                        parent, RESOURCE, written.attributes, kind=KINDS[written.kind], status=status,
                        start_time=written.start_ns, end_time=written.end_ns, instrumentation_scope=SCOPE)


def encoded(written: Written) -> bytes:
    """Ours: the shape and the span's own fields, as the exporter writes them."""
    parent = None if written.parent_span_id is None else bytes.fromhex(written.parent_span_id)
    shape = span_shape(written.name, written.kind, span_attributes(written.attributes), written.error,
                       written.parent_is_remote)
    return span(bytes.fromhex(written.trace_id), bytes.fromhex(written.span_id), parent, written.start_ns,
                written.end_ns, shape)


def request_of(spans: list[bytes]) -> ExportTraceServiceRequest:
    writer = RequestWriter(RESOURCE.attributes, RESOURCE.schema_url, SCOPE.name, SCOPE.version or "")
    return parsed(writer.request(spans))


def ours(spans: list[Written]) -> ExportTraceServiceRequest:
    return request_of([encoded(written) for written in spans])


def theirs(spans: list[Written]) -> ExportTraceServiceRequest:
    return parsed(encode_spans([sdk_span(written) for written in spans]).SerializeToString())


def facts(attributes: dict[str, Any] | None = None, **changes: Any) -> Written:
    fields: dict[str, Any] = {
        "trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8), "parent_span_id": None,
        "parent_is_remote": False, "name": "route echo", "kind": SERVER, "start_ns": 1_764_000_000_123_456_789,
        "end_ns": 1_764_000_000_124_456_789, "error": None,
        "attributes": {"rpc.system": "atp"} if attributes is None else attributes}
    return Written(**(fields | changes))


@pytest.mark.parametrize("changes", [
    {},
    {"parent_span_id": "00f067aa0ba902b7", "parent_is_remote": True},
    {"parent_span_id": "00f067aa0ba902b7", "kind": CLIENT, "name": "invoke_agent echo"},
    {"error": "AGENT_ERROR"},
    {"attributes": {}},
    {"attributes": {"s": "ü 中文 \x00 tab\t", "big": 2**62, "negative": -1, "min": -(2**63), "zero": 0,
                    "pi": 3.14159, "negative float": -0.5, "yes": True, "no": False, "tags": ("a", "b"),
                    "flags": (True, False), "counts": (1, -2, 300), "ratios": (0.5,), "empty": ""}},
    {"name": "x" * 300, "attributes": {"long": "y" * 70_000}},
    {"start_ns": 0, "end_ns": 2**64 - 1},
    {"trace_id": "0" * 31 + "1", "span_id": "f" * 16},
])
def test_one_span_decodes_as_the_sdk_encodes_it(changes: dict[str, Any]) -> None:
    spans = [facts(**changes)]
    assert ours(spans) == theirs(spans)


ENDPOINTS = [("http://127.0.0.1:9001/call", "rest"), ("127.0.0.1:50051", "grpc"),
             ("http://127.0.0.1:9002/mcp#search", "mcp")]


def own_attributes(call: ExportedCall) -> dict[str, Any]:
    """The router's span's attributes of this call alone; a lone surrogate (which the SDK's encoder refuses) as
    the '?' ours writes."""
    request_id = call.request_id.encode("utf-8", "replace").decode()
    return {"agentreach.request_id": request_id} | (usage_attributes(call.usage) if call.usage else {})


def expected_spans(call: ExportedCall) -> list[Written]:
    """What a routed call's spans must say, derived here from the call: the router's span under the caller's,
    timed from the call's wall-clock start, and each attempt's under the router's."""
    start = int(call.started_at * 1e9)
    router = Written(call.trace_id, call.span_id, call.parent_span_id,
                     call.parent_span_id is not None, f"route {call.capability}", SERVER, start,
                     start + int(call.total_ms * 1e6), route_attributes(*route_facts(call)) | own_attributes(call),
                     call.error_code)
    attempts = []
    for number, attempt in enumerate(call.attempts, 1):
        error = attempt.error_code.value if attempt.error_code is not None else None
        began = start + int(attempt.started_ms * 1e6)
        operation = "execute_tool" if attempt.protocol == "mcp" else "invoke_agent"
        attempts.append(Written(
            call.trace_id, attempt.span_id, call.span_id, False, f"{operation} {call.capability}",
            CLIENT, began, began + int(attempt.elapsed_ms * 1e6),
            attempt_attributes(call.capability, attempt.instance, attempt.endpoint, attempt.protocol, number, error),
            error))
    return [router, *attempts]


def test_a_batch_of_routed_calls_decodes_as_the_sdk_encodes_it() -> None:
    calls = []
    for number in range(50):
        attempts = [AttemptTrace(instance=f"agent-{n}", endpoint=endpoint, protocol=protocol, started_ms=0.1 * n,
                                 elapsed_ms=1.5, span_id=secrets.token_hex(8),
                                 error_code=ErrorCode.AGENT_ERROR if (number + n) % 3 == 0 else None)
                    for n, (endpoint, protocol) in enumerate(ENDPOINTS[:number % 4])]
        # Request ids of every length: a byte's worth of lengths and past it, non-ASCII and a lone surrogate.
        request_id = ("r" * (number * 3) + "-é中-\udcff")[: number * 3 + 5]
        calls.append(ExportedCall(
            request_id=request_id, capability="echo", started_at=1_764_000_000.25 + number, total_ms=2.5 * number,
            outcome="success" if number % 3 else "failed", error_code=None if number % 3 else "NO_HEALTHY_INSTANCE",
            caller="client-1" if number % 2 else None, policy=("least_load", "scored", None)[number % 3],
            degraded=number % 7 == 0, reason="failover" if number % 14 == 0 else None,
            usage=Usage(input_tokens=number, output_tokens=2 * number,
                        cost=0.01 * number if number % 2 else None) if number % 4 == 1 else None,
            attempts=attempts, trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8),
            parent_span_id=secrets.token_hex(8) if number % 5 else None))
    ours_encoded = [encoded_span for call in calls for encoded_span in call_spans(call)]
    expected = [written for call in calls for written in expected_spans(call)]
    assert len(ours_encoded) == len(expected) == sum(1 + len(call.attempts) for call in calls)
    assert request_of(ours_encoded) == theirs(expected)


def test_equal_values_of_other_types_stay_apart_and_a_full_cache_is_emptied(monkeypatch) -> None:
    monkeypatch.setattr(otlp_wire, "MAX_ENCODED", 3)
    spans = [facts(attributes={"same": value, "request_id": f"req-{n}"})
             for n, value in enumerate([True, 1, 1.0, False, 0, 0.0, "1", True, 1, 1.0])]
    assert ours(spans) == theirs(spans)
    assert len(otlp_wire._encoded) <= 3


def test_a_lone_surrogate_is_written_as_valid_utf8() -> None:
    """aiohttp decodes a header's bad bytes as surrogates; the SDK's encoder would fail the whole batch."""
    written = ours([facts(name="route \udcff", attributes={"agentreach.request_id": "id-\udcff"})])
    [written_span] = written.resource_spans[0].scope_spans[0].spans
    assert (written_span.name, written_span.attributes[0].value.string_value) == ("route ?", "id-?")


def test_an_attribute_of_another_type_is_refused_not_written() -> None:
    with pytest.raises(TypeError, match="attribute value"):
        span_attributes({"bad": {"nested": 1}})
