"""The router with OTLP trace export on vs off, side by side in one run, one command:
`python bench/otel_bench.py [--rounds 6] [--seconds 4] [--concurrency 16]`.

One `agentreach registry`, bench/router_bench.py's aiohttp echo as a rest agent, and two routers following
the registry, each in a process of its own: `off` (`agentreach router --auth off`, its defaults otherwise:
audit on) and `on` (the same with `--otlp-endpoint`, exporting every call's spans to a sink, `sink` below:
an OTLP/HTTP receiver in its own process that decodes each request and counts its spans). Rounds alternate
the two (the order reversed every other round) with 16 calls in flight of a 1 KB payload; per way calls/s,
p50 / p99, CPU a call (the router process, and with its children: the audit writer and, when on, the
exporter process), and the median over rounds of on ÷ off calls/s; the sink's span count shows the export
happened, and the exporter's and the sink's CPU a call exported (over the whole run) where the cost lies.
Results: a table on stdout and JSON in bench/results/otel_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from common import (
    RESULTS,
    ROUTER_BENCH,
    RegistryProcess,
    cpu_seconds,
    free_port,
    keep_alive,
    machine,
    spawn,
    stop_processes,
    wait_http,
)
from protocols_bench import alternating, poster, until_routable

PAYLOAD = {"text": "x" * 1000}


def sink(port: int) -> None:
    """An OTLP/HTTP receiver that decodes what it is sent and counts the spans (GET /spans)."""
    spans = 0

    async def traces(request: web.Request) -> web.Response:
        nonlocal spans
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        spans += sum(len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans)
        return web.Response(content_type="application/x-protobuf")

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"spans": spans})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/spans", count)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def run(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    ports = {name: free_port() for name in ("echo", "off", "on", "sink")}
    echo, collector = f"http://127.0.0.1:{ports['echo']}", f"http://127.0.0.1:{ports['sink']}"
    with tempfile.TemporaryDirectory() as work:
        registry = RegistryProcess(Path(work) / "registry")
        receiver = spawn(__file__, "sink", "--port", str(ports["sink"]))
        processes = [spawn(ROUTER_BENCH, "echo", "--port", str(ports["echo"])), receiver]
        routers = {
            way: spawn(
                "-m",
                "agentreach.cli",
                "router",
                "--port",
                str(ports[way]),
                "--registry",
                registry.url,
                "--log-level",
                "warning",
                "--auth",
                "off",
                "--data-dir",
                f"{work}/{way}",
                *extra,
            )
            for way, extra in (("off", ()), ("on", ("--otlp-endpoint", collector)))
        }
        processes += routers.values()
        beating: asyncio.Task[None] | None = None
        try:
            await registry.wait_ready()
            for url in (
                f"{echo}/healthz",
                f"{collector}/spans",
                *(f"http://127.0.0.1:{ports[way]}/healthz" for way in ("off", "on")),
            ):
                await wait_http(url)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                registration = {
                    "agent_id": "bench-echo-1",
                    "service": "bench-echo",
                    "capabilities": [
                        {"name": "bench.echo", "protocol": "rest", "endpoint": f"{echo}/echo", "timeout_sla_ms": 5000}
                    ],
                }
                async with session.post(f"{registry.url}/register", json=registration) as response:
                    response.raise_for_status()
                beating = asyncio.create_task(keep_alive(registry.url, "bench-echo-1"))
                ways = {
                    way: poster(
                        session, f"http://127.0.0.1:{ports[way]}/atp", {"capability": "bench.echo", "payload": PAYLOAD}
                    )
                    for way in ("off", "on")
                }
                await until_routable(ways)
                exporter = exporter_of(routers["on"].pid)
                before = cpu_seconds(exporter), cpu_seconds(receiver.pid)
                results = await alternating(
                    ways, rounds, seconds, concurrency, {way: process.pid for way, process in routers.items()}
                )
                calls_on = sum(run["calls"] for run in results["on"])
                spans = await exported(session, collector, at_least=calls_on)
                spent = cpu_seconds(exporter) - before[0], cpu_seconds(receiver.pid) - before[1]
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
            registry.stop()
    summary = summarize(results, rounds, seconds, concurrency, spans, calls_on)
    summary["exporter_cpu_us"], summary["sink_cpu_us"] = (seconds_spent / calls_on * 1e6 for seconds_spent in spent)
    return summary


def exporter_of(router: int) -> int:
    """The `on` router's exporter process, among its children (the other is its audit writer)."""
    for child in Path(f"/proc/{router}/task/{router}/children").read_text().split():
        if b"router.otel_exporter" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise RuntimeError(f"router {router} runs no OTLP exporter")


async def exported(session: aiohttp.ClientSession, collector: str, at_least: int, timeout: float = 30) -> int:
    """The sink's span count once the `on` router's queue has drained (each call is two spans), or at the
    deadline (spans past the batch queue are dropped by design: the count then shows how many)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with session.get(f"{collector}/spans") as response:
            spans = (await response.json())["spans"]
        if spans >= 2 * at_least or asyncio.get_running_loop().time() > deadline:
            return int(spans)
        await asyncio.sleep(0.2)


def summarize(
    results: dict[str, list[dict[str, Any]]], rounds: int, seconds: float, concurrency: int, spans: int, calls_on: int
) -> dict[str, Any]:
    keys = ("calls_per_s", "p50_ms", "p99_ms", "own_cpu_us", "cpu_us")
    ways = {way: {key: statistics.median(run[key] for run in runs) for key in keys} for way, runs in results.items()}
    ratio = statistics.median(
        on["calls_per_s"] / off["calls_per_s"] for on, off in zip(results["on"], results["off"], strict=True)
    )
    return {
        "machine": machine(),
        "rounds": rounds,
        "seconds": seconds,
        "concurrency": concurrency,
        "payload_bytes": len(json.dumps(PAYLOAD)),
        "ways": ways,
        "on_over_off": ratio,
        "calls_exporting": calls_on,
        "spans_received": spans,
        "raw": results,
    }


def report(summary: dict[str, Any]) -> None:
    print(
        f"{summary['rounds']} rounds x {summary['seconds']} s per way, {summary['concurrency']} calls in flight, "
        f"{summary['payload_bytes']} B payload; medians over rounds"
    )
    print(f"{'router':<10}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'router µs':>12}{'+children µs':>14}")
    for way, figures in summary["ways"].items():
        print(
            f"{way:<10}{figures['calls_per_s']:>10.0f}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}"
            f"{figures['own_cpu_us']:>12.0f}{figures['cpu_us']:>14.0f}"
        )
    print("(CPU a call: the router process alone, and with its children: the audit writer, the exporter)")
    print(f"\nexport on / off, calls/s (median of paired rounds): {summary['on_over_off']:.3f}")
    print(f"spans received {summary['spans_received']} for {summary['calls_exporting']} calls (2 spans a call)")
    print(f"CPU a call exported, over the whole run: the exporter {summary['exporter_cpu_us']:.1f} µs, "
          f"the sink (the collector's stand-in) {summary['sink_cpu_us']:.1f} µs")


def main() -> None:
    if sys.argv[1:2] == ["sink"]:
        parser = argparse.ArgumentParser()
        parser.add_argument("sink")
        parser.add_argument("--port", type=int, required=True)
        sink(parser.parse_args().port)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    summary = asyncio.run(run(args.rounds, args.seconds, args.concurrency))
    report(summary)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "otel_bench.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
