"""OpenTelemetry trace export over OTLP/HTTP, off unless asked for.

Asked for by ``--otlp-endpoint URL`` (the collector's base URL; traces go to ``URL/v1/traces``) or by the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``OTEL_SDK_DISABLED=true``
turns it off whatever else is set. The SDK's other variables are honoured as the SDK reads them:
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION``.

The registry and the console export through the SDK's batch processor: its own thread encodes and sends
spans, so a slow or absent collector costs a server's event loop a queue append per span, and spans past the
queue (``OTEL_BSP_MAX_QUEUE_SIZE``) are dropped rather than held. They get one server span per request
(``traced``), continuing the caller's W3C trace. The router, whose every call is a trace, builds its spans
from each finished call in an exporter process of its own (router/otel.py), which batches by frame rather
than by ``OTEL_BSP_*`` and reads the exporter's variables as the SDK does (router/otlp_http.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SCOPE = InstrumentationScope("agentreach", "0.1.0")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_propagator = TraceContextTextMapPropagator()


def wanted(endpoint: str | None) -> bool:
    """Whether traces are to be exported: a flag or the standard variables, unless the SDK is disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(endpoint) or any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces path under a collector's base URL, as the spec derives it from the base variable."""
    return f"{endpoint.rstrip('/')}/v1/traces"


def resource_for(service: str) -> Resource:
    """The SDK's resource (its detectors, OTEL_RESOURCE_ATTRIBUTES), named ``service`` unless OTEL_SERVICE_NAME is."""
    return Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service})


class Otlp:
    """A server's export pipeline: a tracer provider with its resource and sampler, and the batch processor."""

    def __init__(self, service: str, endpoint: str | None):
        self.provider = TracerProvider(resource=resource_for(service))
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint) if endpoint else None)))
        self.tracer = self.provider.get_tracer(SCOPE.name, SCOPE.version)

    async def close(self) -> None:
        """Send what is queued (bounded by OTEL_BSP_EXPORT_TIMEOUT) and stop the processor's thread."""
        await asyncio.to_thread(self.provider.shutdown)


def start(service: str, endpoint: str | None) -> Otlp | None:
    return Otlp(service, endpoint) if wanted(endpoint) else None


def trace_requests(app: web.Application, otlp: Otlp | None) -> None:
    """Give every request ``app`` serves its server span, outermost, so the span sees the final status."""
    if otlp is not None:
        app.middlewares.insert(0, traced(otlp))


async def stop(otlp: Otlp | None) -> None:
    if otlp is not None:
        await otlp.close()


def traced(otlp: Otlp) -> Middleware:
    """An aiohttp middleware: each request a server span (``METHOD route``), in the caller's trace when its
    ``traceparent`` is valid, with the HTTP semantic conventions' attributes; a 5xx is an error."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        # An unmatched path is the caller's choice: kept out of the span's name, which backends index.
        route = resource.canonical if resource is not None else "(unmatched)"
        with otlp.tracer.start_as_current_span(
                f"{request.method} {route}", context=_propagator.extract(request.headers), kind=SpanKind.SERVER,
                attributes={"http.request.method": request.method, "http.route": route, "url.path": request.path,
                            "url.scheme": request.scheme, "network.protocol.name": "http"},
                record_exception=False, set_status_on_exception=False) as span:
            status, error_type = 500, None
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            except BaseException as exc:
                error_type = type(exc).__qualname__
                raise
            finally:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(StatusCode.ERROR)
                    span.set_attribute("error.type", error_type or str(status))

    return middleware
