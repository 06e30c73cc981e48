"""OpenTelemetry export over OTLP/HTTP to a real receiver on 127.0.0.1: one ATP call that fails over once is
one trace under the caller's trace id (the router's span, two attempt spans, the agent's span under the
attempt that reached it) with the semantic conventions' attributes; refusals carry the error status; an
unsampled caller exports nothing; the registry and the console trace their requests; without an endpoint
nothing is set up at all."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentreach.cli import build_parser
from agentreach.knobs import router_settings
from conftest import wait_for
from otlp_support import OtlpReceiver, ReceivedSpan
from recording_support import Received, RecordingServer
from registry.server import RegistryServer, RegistrySettings
from router.core import RouterSettings
from router_support import capability
from weblayer import otel

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SERVER, CLIENT = 2, 3  # the proto's span kinds
ERROR = 2


@pytest.fixture
async def receiver(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the SDK's variable: batches leave every 50 ms
    server = await OtlpReceiver().start()
    yield server
    await server.stop()


class TracedAgent(RecordingServer):
    """A rest agent instrumented as any OTel user would: its span continues the traceparent it is sent."""

    def __init__(self, collector: str):
        super().__init__(self._echo)
        self.provider = TracerProvider(resource=Resource.create({"service.name": "echo-agent"}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
        self.tracer = self.provider.get_tracer("echo-agent")

    async def _echo(self, request: web.Request, received: Received) -> web.Response:
        context = TraceContextTextMapPropagator().extract(request.headers)
        with self.tracer.start_as_current_span("echo", context=context, kind=SpanKind.SERVER):
            return web.json_response({"echo": received.json()})

    async def stop(self) -> None:
        await super().stop()
        await asyncio.to_thread(self.provider.shutdown)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def spans_of(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    await wait_for(lambda: len(receiver.of_trace(trace_id)) >= count, timeout=10,
                   what=f"{count} spans of trace {trace_id}")
    return receiver.of_trace(trace_id)


async def test_a_call_that_fails_over_once_is_one_trace_from_the_caller_to_the_agent(start_mesh, receiver):
    mesh = await start_mesh(router_settings={"otlp_endpoint": receiver.url})
    agent = await TracedAgent(receiver.url).start()
    try:
        await mesh.register("gone", [capability("echo", f"http://127.0.0.1:{closed_port()}/call")], service="echo")
        await mesh.register("alive", [capability("echo", f"{agent.url}/call")], service="echo")
        await mesh.heartbeat("gone")
        await mesh.heartbeat("alive", load=0.5)  # least-load tries the idle-looking unreachable one first
        await mesh.until_state("gone")
        await mesh.until_state("alive")
        answer = await mesh.call("echo", {"n": 1}, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert answer.status == 200 and answer.route["attempts"] == 2, answer.body
        spans = await spans_of(receiver, CALLER_TRACE, 4)
    finally:
        await agent.stop()
    [router] = [span for span in spans if span.service == "agentreach-router" and span.kind == SERVER]
    attempts = sorted((span for span in spans if span.kind == CLIENT), key=lambda span: span.start_ns)
    [served] = [span for span in spans if span.service == "echo-agent"]
    assert len(spans) == 4 and len(attempts) == 2
    assert (router.name, router.parent_span_id) == ("route echo", CALLER_SPAN)
    assert router.attributes == {
        "rpc.system": "atp", "rpc.method": "echo", "agentreach.capability": "echo",
        "agentreach.request_id": answer.body["request_id"], "agentreach.outcome": "degraded",
        "agentreach.attempts": 2, "gen_ai.agent.id": "alive", "agentreach.policy": "least_load",
        "agentreach.degraded_reason": "failover"}
    assert router.status_code != ERROR
    assert [span.parent_span_id for span in attempts] == [router.span_id] * 2
    assert [span.attributes["gen_ai.agent.id"] for span in attempts] == ["gone", "alive"]
    first, second = attempts
    assert (first.name, first.status_code, first.attributes["error.type"]) == ("invoke_agent echo", ERROR,
                                                                              "AGENT_ERROR")
    assert "error.type" not in second.attributes and second.status_code != ERROR
    assert (second.attributes["server.address"], second.attributes["server.port"]) == ("127.0.0.1", agent.port)
    assert (second.attributes["rpc.system"], second.attributes["gen_ai.operation.name"]) == ("rest", "invoke_agent")
    # The agent's span hangs under the attempt that reached it: the traceparent it was sent named that attempt.
    assert served.parent_span_id == second.span_id
    assert router.start_ns <= first.start_ns <= first.end_ns <= second.start_ns <= second.end_ns <= router.end_ns
    trace = await mesh.get(f"/traces/{answer.body['request_id']}")
    assert [attempt["span_id"] for attempt in trace["call"]["attempts"]] == [first.span_id, second.span_id]


async def test_every_call_is_exported_whether_or_not_the_trace_store_keeps_it(start_mesh, receiver, start_agent):
    """The store keeps one plain success a second; export hands over a record of its own for every call."""
    mesh = await start_mesh(routing=RouterSettings(traced_successes_per_second=1),
                            router_settings={"otlp_endpoint": receiver.url})
    await mesh.add(await start_agent("a1"))
    request_ids = set()
    while mesh.router.traces.sampled_out < 3:  # calls milliseconds apart: a few share each second
        assert len(request_ids) < 50, "the trace store kept every call: nothing here tests export without it"
        answer = await mesh.call("echo", {"n": len(request_ids)})
        assert answer.status == 200, answer.body
        request_ids.add(answer.body["request_id"])

    def exported() -> set[str]:
        return {span.attributes["agentreach.request_id"] for span in receiver.spans if span.name == "route echo"}
    await wait_for(lambda: request_ids <= exported(), timeout=10, what="every call's router span")
    attempts = [span for span in receiver.spans if span.name == "invoke_agent echo"]
    assert len(attempts) == len(request_ids)


async def test_a_refused_call_is_an_error_span_and_an_unsampled_caller_exports_nothing(start_mesh, receiver):
    mesh = await start_mesh(router_settings={"otlp_endpoint": receiver.url})
    unsampled = "11111111111111111111111111111111"
    await mesh.call("nothing.here", headers={"traceparent": f"00-{unsampled}-{CALLER_SPAN}-00"})
    answer = await mesh.call("nothing.here", headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert answer.status == 404
    [router] = await spans_of(receiver, CALLER_TRACE, 1)
    assert (router.status_code, router.status_message) == (ERROR, "UNKNOWN_CAPABILITY")
    assert router.attributes["error.type"] == "UNKNOWN_CAPABILITY" and router.attributes["agentreach.attempts"] == 0
    # Spans leave in the order calls end: the unsampled call's would have come first.
    assert receiver.of_trace(unsampled) == []


@pytest.mark.parametrize("sampler", ["always_off", "traceidratio"])
async def test_a_trace_the_call_starts_is_sampled_as_the_variables_say(start_mesh, receiver, start_agent,
                                                                      monkeypatch, sampler):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")  # traceidratio at 0: none
    mesh = await start_mesh(router_settings={"otlp_endpoint": receiver.url})
    await mesh.add(await start_agent("a1"))
    started = await mesh.call("echo", {})
    continued = await mesh.call("echo", {}, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert started.status == continued.status == 200
    # A caller's sampled trace is the caller's decision; the call's own trace is the sampler's, and it said no.
    assert len(await spans_of(receiver, CALLER_TRACE, 2)) == 2
    own_trace = (await mesh.get(f"/traces/{started.body['request_id']}"))["call"]["trace_id"]
    assert receiver.of_trace(own_trace) == []


async def test_a_killed_exporter_process_is_replaced_and_export_goes_on(start_mesh, receiver, start_agent):
    mesh = await start_mesh(router_settings={"otlp_endpoint": receiver.url})
    await mesh.add(await start_agent("a1"))
    export = mesh.router_server.export
    first = export.exporter_pid
    os.kill(first, signal.SIGKILL)
    await wait_for(lambda: export.exporter_pid not in (None, first), timeout=10, what="a new exporter process")
    answer = await mesh.call("echo", {}, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert answer.status == 200
    assert {span.name for span in await spans_of(receiver, CALLER_TRACE, 2)} == {"route echo", "invoke_agent echo"}


async def test_calls_dropped_while_no_exporter_runs_are_counted_in_metrics(start_mesh, receiver, start_agent):
    mesh = await start_mesh(router_settings={"otlp_endpoint": receiver.url})
    await mesh.add(await start_agent("a1"))
    export = mesh.router_server.export
    assert "agentreach_router_otlp_dropped_calls_total 0.0" in await mesh.get("/metrics")
    first = export.exporter_pid
    os.kill(first, signal.SIGKILL)
    await wait_for(lambda: export.exporter_pid not in (None, first), timeout=10, what="a new exporter process")
    os.kill(export.exporter_pid, signal.SIGKILL)  # a second death within 5 s: no new exporter for a while
    await wait_for(lambda: export.exporter_pid is None, timeout=10, what="the second exporter to be reaped")
    answer = await mesh.call("echo", {}, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert answer.status == 200  # export is best effort: the call itself is untouched
    await wait_for(lambda: export.dropped >= 1, timeout=5, what="the call's spans to be dropped")
    assert f"agentreach_router_otlp_dropped_calls_total {float(export.dropped)}" in await mesh.get("/metrics")


async def test_an_endpoint_that_is_no_url_turns_export_off_once_not_in_a_loop(start_mesh, start_agent, monkeypatch,
                                                                               capfd):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")  # no scheme
    mesh = await start_mesh()
    await mesh.add(await start_agent("a1"))
    export = mesh.router_server.export
    first = export.exporter_pid
    errors: list[str] = []

    def said() -> bool:
        errors.append(capfd.readouterr().err)
        return "OTLP export is off: the OTLP endpoint" in "".join(errors)

    await wait_for(said, timeout=10, what="the exporter to say export is off")
    for n in range(300):  # more than a frame's worth, read and dropped by the same exporter
        assert (await mesh.call("echo", n)).status == 200
    await wait_for(lambda: not export._pending, timeout=5, what="the calls to be handed over")
    assert (export.exporter_pid, export.dropped) == (first, 0)


async def test_the_registry_and_the_console_trace_their_requests_from_the_standard_variable(
        receiver, monkeypatch, tmp_path, http, start_console):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    registry = RegistryServer(RegistrySettings(data_dir=tmp_path / "data", port=0, auth=False))
    await registry.start()
    try:
        console = await start_console(registry.url, "http://127.0.0.1:9")
        for url in (f"{registry.url}/healthz", f"{console.url}/healthz"):
            async with http.get(url, headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}) as response:
                assert response.status == 200
        spans = await spans_of(receiver, CALLER_TRACE, 2)
    finally:
        await registry.stop()
    assert {(span.service, span.name, span.kind, span.parent_span_id) for span in spans} == {
        ("agentreach-registry", "GET /healthz", SERVER, CALLER_SPAN),
        ("agentreach-console", "GET /healthz", SERVER, CALLER_SPAN)}
    assert all(span.attributes["http.response.status_code"] == 200 and span.attributes["http.route"] == "/healthz"
               for span in spans)


async def test_without_an_endpoint_nothing_is_set_up(start_mesh, monkeypatch):
    for name in otel.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    mesh = await start_mesh()
    assert (mesh.router_server.export, mesh.router.export) == (None, None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert otel.wanted(None)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not otel.wanted("http://127.0.0.1:9")


def test_the_flag_takes_an_http_url_and_reaches_the_settings(tmp_path, capsys):
    parser = build_parser()
    args = parser.parse_args(["router", "--otlp-endpoint", "http://127.0.0.1:4318", "--data-dir", str(tmp_path)])
    assert router_settings(args, 8080, "http://127.0.0.1:8081").otlp_endpoint == "http://127.0.0.1:4318"
    for command in ("up", "registry", "router", "console"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([command, "--otlp-endpoint", "grpc://127.0.0.1:4317"])
        assert exited.value.code == 2
        assert "expected http://host:port" in capsys.readouterr().err
