"""The router's OTLP exporter process: finished calls in on stdin, their spans out to the collector.

CallExport (router/otel.py) runs it as ``python -m router.otel_exporter SERVICE [ENDPOINT]``, with the
router's environment (so every OTEL_* variable reaches the SDK here). Building a span and encoding it as
protobuf costs some 30 µs of Python a span on these machines, which in the router would take its GIL:
here it takes neither the GIL nor the event loop's time, as the audit writer does for SQLite. A frame is a
4-byte big-endian length and a msgpack array of ``Finished`` calls; EOF (the router stopped or died) sends
what is queued and exits.

A routed call is the router's span (kind SERVER), continuing the caller's W3C trace (its parent the caller's
span), and a child span (kind CLIENT) per attempt whose id is the one the agent received in its
``traceparent``, so an instrumented agent's span hangs under the attempt that reached it. Attributes follow
the semantic conventions where one fits (RPC and server address, GenAI agent, tool and token usage,
``error.type``), the mesh's own facts under ``agentreach.*``; a call answered with an error has the error
status, its code the description. A call that starts a trace is sampled by the SDK's configured sampler
(``OTEL_TRACES_SAMPLER``); the router sends no call whose caller did not sample it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, BinaryIO

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from yarl import URL

from router.otel import FRAME, Finished
from router.tracecontext import CallSpan
from router.traces import AttemptTrace, CallTrace
from weblayer.otel import SCOPE, Otlp

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)
_decoder = msgspec.msgpack.Decoder(list[Finished])


@functools.lru_cache(maxsize=4096)
def server_of(endpoint: str) -> tuple[str, int] | None:
    """The host and port an endpoint names (``http://h:p/x``, ``redis://h:p/s``, a gRPC ``h:p``)."""
    try:
        url = URL(endpoint if "://" in endpoint else f"grpc://{endpoint}")
    except ValueError:
        return None
    return (url.host, url.port) if url.host and url.port else None


def _operation(attempt: AttemptTrace) -> str:
    """The GenAI operation an attempt is: an MCP server's tool executed, else an agent invoked."""
    return "execute_tool" if attempt.protocol == "mcp" else "invoke_agent"


def _attempt_attributes(call: CallTrace, attempt: AttemptTrace, number: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {"rpc.system": attempt.protocol, "rpc.method": call.capability,
                                  "gen_ai.operation.name": _operation(attempt), "gen_ai.agent.id": attempt.instance,
                                  "agentreach.capability": call.capability, "agentreach.attempt": number}
    if attempt.protocol == "mcp":
        attributes["gen_ai.tool.name"] = URL(attempt.endpoint).fragment
    server = server_of(attempt.endpoint)
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    if attempt.error_code is not None:
        attributes["error.type"] = attempt.error_code.value
    return attributes


def _call_attributes(call: CallTrace) -> dict[str, Any]:
    attributes: dict[str, Any] = {"rpc.system": "atp", "rpc.method": call.capability,
                                  "agentreach.capability": call.capability, "agentreach.request_id": call.request_id,
                                  "agentreach.outcome": call.outcome, "agentreach.attempts": len(call.attempts)}
    if call.attempts:
        attributes["gen_ai.agent.id"] = call.attempts[-1].instance
    if call.caller is not None:
        attributes["agentreach.client_id"] = call.caller
    if call.policy is not None:
        attributes["agentreach.policy"] = call.policy
    if call.degraded:
        attributes["agentreach.degraded_reason"] = call.reason or "degraded"
    if call.usage is not None:
        attributes["gen_ai.usage.input_tokens"] = call.usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = call.usage.output_tokens
        if call.usage.cost is not None:
            attributes["agentreach.cost"] = call.usage.cost
    if call.error_code is not None:
        attributes["error.type"] = call.error_code
    return attributes


def _status(error_code: str | None) -> Status:
    return _OK if error_code is None else Status(StatusCode.ERROR, error_code)


def call_spans(call: CallTrace, span: CallSpan, otlp: Otlp) -> list[ReadableSpan]:
    """The router's span and one per attempt, timed from the call's wall-clock start."""
    trace_id = int(span.trace_id, 16)
    router = SpanContext(trace_id, int(span.span_id, 16), is_remote=False, trace_flags=_SAMPLED)
    parent = SpanContext(trace_id, int(span.parent_span_id, 16), is_remote=True, trace_flags=_SAMPLED) \
        if span.parent_span_id is not None else None
    start = int(call.started_at * 1e9)
    spans = [ReadableSpan(f"route {call.capability}", router, parent, otlp.resource, _call_attributes(call),
                          kind=SpanKind.SERVER, status=_status(call.error_code), start_time=start,
                          end_time=start + int(call.total_ms * 1e6), instrumentation_scope=SCOPE)]
    for number, attempt in enumerate(call.attempts, 1):
        began = start + int(attempt.started_ms * 1e6)
        spans.append(ReadableSpan(
            f"{_operation(attempt)} {call.capability}",
            SpanContext(trace_id, int(attempt.span_id, 16), is_remote=False, trace_flags=_SAMPLED), router,
            otlp.resource, _attempt_attributes(call, attempt, number), kind=SpanKind.CLIENT,
            status=_status(attempt.error_code.value if attempt.error_code is not None else None), start_time=began,
            end_time=began + int(attempt.elapsed_ms * 1e6), instrumentation_scope=SCOPE))
    return spans


def sampled(span: CallSpan, name: str, otlp: Otlp) -> bool:
    """A call in its caller's trace comes here only when the caller sampled it (router/otel.py); a trace the
    call starts is sampled as the SDK's sampler says."""
    if span.parent_span_id is not None:
        return True
    decision = otlp.sampler.should_sample(None, int(span.trace_id, 16), name).decision
    return decision is Decision.RECORD_AND_SAMPLE


def serve(otlp: Otlp, frames: BinaryIO) -> None:
    """Turn every frame's calls into spans for the batch processor until EOF."""
    while (header := frames.read(FRAME.size)) and len(header) == FRAME.size:
        body = frames.read(FRAME.unpack(header)[0])
        for finished in _decoder.decode(body):
            if sampled(finished.span, finished.call.capability, otlp):
                otlp.emit(call_spans(finished.call, finished.span, otlp))


def main(argv: list[str]) -> None:
    service, endpoint = argv[1], argv[2] if len(argv) > 2 else None
    otlp = Otlp(service, endpoint)
    try:
        serve(otlp, sys.stdin.buffer)
    finally:
        otlp.provider.shutdown()


if __name__ == "__main__":
    main(sys.argv)
