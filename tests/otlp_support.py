"""A collector's OTLP/HTTP trace receiver on 127.0.0.1, small and real: `POST /v1/traces` takes the protobuf
ExportTraceServiceRequest any OTLP exporter sends (decoded with opentelemetry-proto) and keeps each span
with its resource's service name, for tests to find by trace id."""

from __future__ import annotations

import gzip
from typing import Any

import msgspec
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from recording_support import Received, RecordingServer


class ReceivedSpan(msgspec.Struct, kw_only=True):
    service: str
    name: str
    kind: int  # the proto's: 2 SERVER, 3 CLIENT
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


class OtlpReceiver(RecordingServer):
    def __init__(self) -> None:
        super().__init__(self._traces)
        self.spans: list[ReceivedSpan] = []

    async def _traces(self, request: web.Request, received: Received) -> web.Response:
        if (request.method, request.path) != ("POST", "/v1/traces"):
            return web.Response(status=404)
        body = gzip.decompress(received.body) if request.headers.get("Content-Encoding") == "gzip" else received.body
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        for resource_spans in export.resource_spans:
            resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(ReceivedSpan(
                        service=resource.get("service.name", ""), name=span.name, kind=span.kind,
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={item.key: _value(item.value) for item in span.attributes},
                        status_code=span.status.code, status_message=span.status.message))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]
