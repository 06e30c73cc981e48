"""MCP tools/call through the router vs direct to the MCP server, side by side, one command:
`python bench/mcp_bench.py [--rounds 5] [--seconds 3] [--concurrency 16]`.

examples/mcp_server.py (the official mcp SDK's MCPServer, uvicorn) serves `echo`; `agentreach registry` (probing
every second: MCP servers send no heartbeats) and `agentreach router --auth off --no-audit` run in processes of
their own. Three ways, rounds alternating them: `direct` (tools/call on one session with the server),
`atp.router` (POST /atp to the router, which calls the tool on its own session), `mcp.router` (tools/call to
the router's /mcp, so MCP at both ends). Per way calls/s and p50 / p99, and what the router adds (median over
rounds of routed minus direct). Results: a table on stdout and JSON in bench/results/mcp_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from typing import Any

import aiohttp

from common import RESULTS, free_port, machine, spawn, stop_processes, wait_http
from mesh import mcp_client
from protocols_bench import Call, alternating, poster, until_routable

TEXT = "x" * 1000
TIMEOUT = aiohttp.ClientTimeout(total=10)


def tool_caller(session: aiohttp.ClientSession, url: str, session_id: str | None, name: str) -> Call:
    async def call() -> None:
        try:
            result, _ = await mcp_client.request(
                session, url, session_id, "tools/call", {"name": name, "arguments": {"text": TEXT}}, TIMEOUT
            )
        except mcp_client.McpFailure as failure:
            raise AssertionError(str(failure)) from None
        assert result.get("isError") is False, result

    return call


async def run(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    ports = {name: free_port() for name in ("server", "registry", "router")}
    registry, router = (f"http://127.0.0.1:{ports[name]}" for name in ("registry", "router"))
    server = f"http://127.0.0.1:{ports['server']}/mcp"
    with tempfile.TemporaryDirectory() as data_dir:
        processes = [
            spawn(
                "-m",
                "agentreach.cli",
                "registry",
                "--port",
                str(ports["registry"]),
                "--data-dir",
                data_dir,
                "--log-level",
                "warning",
                "--auth",
                "off",
                "--silence-timeout",
                "3600",
                "--health-interval",
                "1",
            ),
            spawn(
                "-m",
                "agentreach.cli",
                "router",
                "--port",
                str(ports["router"]),
                "--registry",
                registry,
                "--log-level",
                "warning",
                "--auth",
                "off",
                "--data-dir",
                data_dir,
                "--no-audit",
            ),
            spawn("examples/mcp_server.py", "--port", str(ports["server"])),
        ]
        try:
            for url in (f"{registry}/healthz", f"{router}/healthz"):
                await wait_http(url)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await until_up(session, server)
                registration = {
                    "agent_id": "bench-mcp-1",
                    "service": "bench-mcp",
                    "capabilities": [
                        {"name": "bench.echo", "protocol": "mcp", "endpoint": f"{server}#echo", "timeout_sla_ms": 5000}
                    ],
                }
                async with session.post(f"{registry}/register", json=registration) as response:
                    response.raise_for_status()
                ways = {
                    "direct": tool_caller(session, server, await mcp_client.begin(session, server, TIMEOUT), "echo"),
                    "atp.router": poster(
                        session, f"{router}/atp", {"capability": "bench.echo", "payload": {"text": TEXT}}
                    ),
                    "mcp.router": tool_caller(session, f"{router}/mcp", None, "bench.echo"),
                }
                await until_routable(ways)
                results = await alternating(ways, rounds, seconds, concurrency)
        finally:
            stop_processes(processes)
    return summarize(results, rounds, seconds, concurrency)


async def until_up(session: aiohttp.ClientSession, url: str, timeout: float = 30) -> None:
    async def up() -> None:
        while True:
            try:
                await mcp_client.ping(session, url, TIMEOUT)
                return
            except (aiohttp.ClientError, mcp_client.McpFailure):
                await asyncio.sleep(0.1)

    await asyncio.wait_for(up(), timeout)


def summarize(
    results: dict[str, list[dict[str, Any]]], rounds: int, seconds: float, concurrency: int
) -> dict[str, Any]:
    ways = {
        way: {key: statistics.median(run[key] for run in runs) for key in ("calls_per_s", "p50_ms", "p99_ms")}
        for way, runs in results.items()
    }
    direct = results["direct"]
    added = {
        way: {
            key: statistics.median(r[key] - d[key] for r, d in zip(results[way], direct, strict=True))
            for key in ("p50_ms", "p99_ms")
        }
        for way in ("atp.router", "mcp.router")
    }
    return {
        "machine": machine(),
        "rounds": rounds,
        "seconds": seconds,
        "concurrency": concurrency,
        "text_bytes": len(TEXT),
        "ways": ways,
        "added_by_router": added,
        "raw": results,
    }


def report(summary: dict[str, Any]) -> None:
    print(
        f"{summary['rounds']} rounds x {summary['seconds']} s per way, {summary['concurrency']} calls in flight, "
        f"{summary['text_bytes']} B argument; medians over rounds"
    )
    print(f"{'way':<14}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for way, figures in summary["ways"].items():
        print(f"{way:<14}{figures['calls_per_s']:>10.0f}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}")
    print(f"\n{'added by router':<16}{'p50 ms':>10}{'p99 ms':>10}")
    for way, figures in summary["added_by_router"].items():
        print(f"{way:<16}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    summary = asyncio.run(run(args.rounds, args.seconds, args.concurrency))
    report(summary)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mcp_bench.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
