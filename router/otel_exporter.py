"""The router's OTLP exporter process: finished calls in on stdin, their spans out to the collector.

CallExport (router/otel.py) runs it as ``python -m router.otel_exporter SERVICE [ENDPOINT]``, with the
router's environment, so every OTEL_* variable reaches it. Exporting takes the CPU of its own process, neither
the router's GIL nor its event loop, as the audit writer does for SQLite; and little of it: the spans are
written as protobuf directly (router/otlp_wire.py, a few µs a span where the SDK's objects take some 30) and
each frame's sampled calls leave as one request (router/otlp_http.py: the SDK's variables, its retries). A
frame is a 4-byte big-endian length and a msgpack array of ``ExportedCall`` records; EOF (the router stopped or
died) ends the process once the last frame is sent.

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
import logging
import os
import sys
from typing import Any, BinaryIO

import msgspec
from agent_reach import logs
from agent_reach.usage import Usage
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON, Decision, Sampler
from yarl import URL

from router.otel import FRAME, ExportedCall
from router.otlp_http import CollectorClient, UnusableEndpoint, collector_config
from router.otlp_wire import CLIENT, SERVER, RequestWriter, span_attributes, span_shape, string_attribute
from router.otlp_wire import span as encode_span
from weblayer.otel import SCOPE, resource_for

log = logging.getLogger("agentreach.router.otel")
_decoder = msgspec.msgpack.Decoder(list[ExportedCall])


@functools.lru_cache(maxsize=4096)
def server_of(endpoint: str) -> tuple[str, int] | None:
    """The host and port an endpoint names (``http://h:p/x``, ``redis://h:p/s``, a gRPC ``h:p``)."""
    try:
        url = URL(endpoint if "://" in endpoint else f"grpc://{endpoint}")
    except ValueError:
        return None
    return (url.host, url.port) if url.host and url.port else None


def _operation(protocol: str) -> str:
    """The GenAI operation an attempt is: an MCP server's tool executed, else an agent invoked."""
    return "execute_tool" if protocol == "mcp" else "invoke_agent"


def attempt_attributes(capability: str, instance: str, endpoint: str, protocol: str, number: int,
                       error_type: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"rpc.system": protocol, "rpc.method": capability,
                                  "gen_ai.operation.name": _operation(protocol), "gen_ai.agent.id": instance,
                                  "agentreach.capability": capability, "agentreach.attempt": number}
    if protocol == "mcp":
        attributes["gen_ai.tool.name"] = URL(endpoint).fragment
    server = server_of(endpoint)
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    if error_type is not None:
        attributes["error.type"] = error_type
    return attributes


RouteFacts = tuple[str, str, int, str | None, str | None, str | None, str | None, str | None]


def route_facts(call: ExportedCall) -> RouteFacts:
    """What the router's span says that repeats from call to call: capability, outcome, attempts, the instance
    that answered, the caller, the policy, why it was degraded, the error."""
    return (call.capability, call.outcome, len(call.attempts), call.attempts[-1].instance if call.attempts else None,
            call.caller, call.policy, (call.reason or "degraded") if call.degraded else None, call.error_code)


def route_attributes(capability: str, outcome: str, attempts: int, instance: str | None, caller: str | None,
                     policy: str | None, degraded_reason: str | None, error_type: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"rpc.system": "atp", "rpc.method": capability, "agentreach.capability": capability,
                                  "agentreach.outcome": outcome, "agentreach.attempts": attempts}
    if instance is not None:
        attributes["gen_ai.agent.id"] = instance
    if caller is not None:
        attributes["agentreach.client_id"] = caller
    if policy is not None:
        attributes["agentreach.policy"] = policy
    if degraded_reason is not None:
        attributes["agentreach.degraded_reason"] = degraded_reason
    if error_type is not None:
        attributes["error.type"] = error_type
    return attributes


def usage_attributes(usage: Usage) -> dict[str, Any]:
    """A call's tokens and their cost."""
    attributes: dict[str, Any] = {"gen_ai.usage.input_tokens": usage.input_tokens,
                                  "gen_ai.usage.output_tokens": usage.output_tokens}
    if usage.cost is not None:
        attributes["agentreach.cost"] = usage.cost
    return attributes


def _own_attributes(call: ExportedCall) -> bytes:
    """The router's span's attributes that are this call's alone: its request id, its tokens and cost."""
    request_id = string_attribute("agentreach.request_id", call.request_id)
    return request_id if call.usage is None else request_id + span_attributes(usage_attributes(call.usage))


@functools.lru_cache(maxsize=4096)
def _attempt_shape(capability: str, instance: str, endpoint: str, protocol: str, number: int,
                   error_type: str | None) -> bytes:
    """Encoded once: an attempt's span is the same for every call to one instance that ends alike, but for its
    ids and times."""
    attributes = span_attributes(attempt_attributes(capability, instance, endpoint, protocol, number, error_type))
    return span_shape(f"{_operation(protocol)} {capability}", CLIENT, attributes, error_type, False)


@functools.lru_cache(maxsize=4096)
def _route_shape(facts: RouteFacts, parent_is_remote: bool) -> bytes:
    """Encoded once per capability, outcome, instance, caller and policy that recur together."""
    return span_shape(f"route {facts[0]}", SERVER, span_attributes(route_attributes(*facts)), facts[-1],
                      parent_is_remote)


def call_spans(call: ExportedCall) -> list[bytes]:
    """The router's span (its parent the caller's span, if any) and one per attempt (its parent the router's),
    encoded, timed from the call's wall-clock start."""
    start = int(call.started_at * 1e9)
    trace_id, span_id = bytes.fromhex(call.trace_id), bytes.fromhex(call.span_id)
    parent = None if call.parent_span_id is None else bytes.fromhex(call.parent_span_id)
    spans = [encode_span(trace_id, span_id, parent, start, start + int(call.total_ms * 1e6),
                         _route_shape(route_facts(call), parent is not None), _own_attributes(call))]
    capability = call.capability
    for number, attempt in enumerate(call.attempts, 1):
        began = start + int(attempt.started_ms * 1e6)
        error = attempt.error_code.value if attempt.error_code is not None else None
        spans.append(encode_span(trace_id, bytes.fromhex(attempt.span_id), span_id, began,
                                 began + int(attempt.elapsed_ms * 1e6),
                                 _attempt_shape(capability, attempt.instance, attempt.endpoint, attempt.protocol,
                                                number, error)))
    return spans


def _description(sampler: Sampler) -> str:
    """Asked through Sampler, whose method is annotated (its subclasses' are not)."""
    return sampler.get_description()


# The default sampler (parentbased_always_on) and always_on sample every trace a call starts: not asked per call.
_SAMPLE_EVERY_ROOT = {_description(DEFAULT_ON), _description(ALWAYS_ON)}


def sampled(call: ExportedCall, sampler: Sampler) -> bool:
    """A call in its caller's trace comes here only when the caller sampled it (router/otel.py); a trace the
    call starts is sampled as the SDK's sampler says."""
    if call.parent_span_id is None:
        return sampler.should_sample(None, int(call.trace_id, 16), call.capability).decision is \
            Decision.RECORD_AND_SAMPLE
    return True


def samples_every_root(sampler: Sampler) -> bool:
    return _description(sampler) in _SAMPLE_EVERY_ROOT


class Exporter:
    """The process's one pipeline: its resource and sampler from the SDK, the request writer, the collector."""

    def __init__(self, service: str, endpoint: str | None):
        resource = resource_for(service)
        self.sampler = TracerProvider(resource=resource).sampler  # OTEL_TRACES_SAMPLER(_ARG), as the SDK reads them
        self.every_root = samples_every_root(self.sampler)
        self.writer = RequestWriter(resource.attributes, resource.schema_url, SCOPE.name, SCOPE.version or "")
        self.collector = CollectorClient(collector_config(endpoint, os.environ))

    def export(self, calls: list[ExportedCall]) -> None:
        """One request for a frame's sampled calls."""
        if not self.every_root:
            calls = [call for call in calls if sampled(call, self.sampler)]
        spans = [encoded for call in calls for encoded in call_spans(call)]
        if spans:
            self.collector.send(self.writer.request(spans))


def serve(exporter: Exporter, frames: BinaryIO) -> None:
    """Export every frame's calls until EOF."""
    while (header := frames.read(FRAME.size)) and len(header) == FRAME.size:
        exporter.export(_decoder.decode(frames.read(FRAME.unpack(header)[0])))


def main(argv: list[str]) -> None:
    logs.configure()
    try:
        exporter = Exporter(argv[1], argv[2] if len(argv) > 2 else None)
    except UnusableEndpoint as exc:
        # Said once, then the router's calls are read and dropped: exiting would only have the router start
        # another exporter every few seconds, each saying it again.
        log.error("OTLP export is off: %s", exc)
        drain(sys.stdin.buffer)
        return
    try:
        serve(exporter, sys.stdin.buffer)
    finally:
        exporter.collector.close()


def drain(frames: BinaryIO) -> None:
    while frames.read(1 << 16):
        pass


if __name__ == "__main__":
    main(sys.argv)
