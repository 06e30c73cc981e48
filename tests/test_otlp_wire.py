"""The router's own OTLP/protobuf (router/otlp_wire.py) against the SDK's encoder: for the same spans and
resource, both decode to equal ExportTraceServiceRequests (opentelemetry-proto's messages compared field by
field), whatever the attribute types, parents, statuses and ids."""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

import pytest
from agent_reach.atp import ErrorCode
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from router import otlp_wire
from router.otel_exporter import attempt_attributes, call_attributes, call_spans, route_attributes, route_facts
from router.otlp_wire import CLIENT, SERVER, RequestWriter, SpanFacts, span, span_attributes
from router.tracecontext import CallSpan
from router.traces import AttemptTrace, CallTrace
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
    facts: SpanFacts
    attributes: dict[str, Any]  # what facts.attributes encodes


def sdk_span(facts: SpanFacts, attributes: dict[str, Any]) -> ReadableSpan:
    """The same span as the SDK's exporter is handed one."""
    trace_id = int(facts.trace_id, 16)
    parent = None if facts.parent_span_id is None else SpanContext(
        trace_id, int(facts.parent_span_id, 16), is_remote=facts.parent_is_remote, trace_flags=SAMPLED)
    status = Status(StatusCode.UNSET) if facts.error is None else Status(StatusCode.ERROR, facts.error)
    return ReadableSpan(facts.name, SpanContext(trace_id, int(facts.span_id, 16), is_remote=False, trace_flags=SAMPLED),
                        parent, RESOURCE, attributes, kind=KINDS[facts.kind], status=status,
                        start_time=facts.start_ns, end_time=facts.end_ns, instrumentation_scope=SCOPE)


def ours(spans: list[Written]) -> ExportTraceServiceRequest:
    writer = RequestWriter(RESOURCE.attributes, RESOURCE.schema_url, SCOPE.name, SCOPE.version or "")
    return parsed(writer.request(span(written.facts) for written in spans))


def theirs(spans: list[Written]) -> ExportTraceServiceRequest:
    return parsed(encode_spans([sdk_span(*written) for written in spans]).SerializeToString())


def facts(attributes: dict[str, Any] | None = None, **changes: Any) -> Written:
    attributes = {"rpc.system": "atp"} if attributes is None else attributes
    fields: dict[str, Any] = {
        "trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8), "parent_span_id": None,
        "parent_is_remote": False, "name": "route echo", "kind": SERVER, "start_ns": 1_764_000_000_123_456_789,
        "end_ns": 1_764_000_000_124_456_789, "error": None}
    return Written(SpanFacts(**(fields | changes), attributes=span_attributes(attributes)), attributes)


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


def test_a_batch_of_routed_calls_decodes_as_the_sdk_encodes_it() -> None:
    calls = []
    for number in range(50):
        attempts = [AttemptTrace(instance=f"agent-{n}", endpoint=endpoint, protocol=protocol, started_ms=0.1 * n,
                                 elapsed_ms=1.5, span_id=secrets.token_hex(8),
                                 error_code=ErrorCode.AGENT_ERROR if (number + n) % 3 == 0 else None)
                    for n, (endpoint, protocol) in enumerate(ENDPOINTS[:number % 4])]
        call = CallTrace(request_id=f"req-{number}", capability="echo", trace_id=secrets.token_hex(16),
                         started_at=1_764_000_000.25 + number, caller="client-1" if number % 2 else None,
                         attempts=attempts, outcome="ok" if number % 3 else "error",
                         error_code=None if number % 3 else "NO_HEALTHY_INSTANCE", total_ms=2.5 * number)
        calls.append((call, CallSpan(trace_id=call.trace_id, span_id=secrets.token_hex(8),
                                     parent_span_id=secrets.token_hex(8) if number % 5 else None)))
    spans = []
    for call, span_of_call in calls:
        router, *attempts_of_call = call_spans(call, span_of_call)
        spans.append(Written(router, route_attributes(*route_facts(call)) | call_attributes(call)))
        spans += [Written(facts_of_attempt, attempt_attributes(
            call.capability, attempt.instance, attempt.endpoint, attempt.protocol, number,
            attempt.error_code.value if attempt.error_code is not None else None))
            for number, (facts_of_attempt, attempt) in enumerate(zip(attempts_of_call, call.attempts, strict=True), 1)]
    assert len(spans) == sum(1 + len(call.attempts) for call, _ in calls)
    assert ours(spans) == theirs(spans)


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
