"""Each protocol the router speaks, side by side, one command:
`python bench/protocols_bench.py [--rounds 5] [--seconds 3] [--concurrency 16]`.

The same echo work reached ten ways in one run, rounds alternating the ways (order reversed every other round)
so a burst of load on this shared machine hits them alike:

  rest       bench/router_bench.py's echo agent (aiohttp, POST /echo): direct, and through the router
  atp        an SDK agent's capability over HTTP (POST /atp/bench.atp): direct, and through the router
  websocket  the same SDK agent's capability over its WebSocket (/ws/bench.ws): direct (one connection, calls
             multiplexed on it, as the router does), and through the router
  grpc       the same SDK agent's capability over its gRPC server (bench.grpc): direct (one channel, as the
             router keeps), and through the router
  mq         the same SDK agent's capability taken from its request stream on a redis-server (bench.mq): direct
             (a caller appending to the stream and reading a reply stream of its own, one reader handing answers
             out by call id, as the router does), and through the router (`--broker`)

`agentreach registry`, `agentreach router --auth off --no-audit --broker` and redis-server (no persistence) run in
processes of their own, each agent too; the callers are this process (`--concurrency` calls in flight per way,
1 KB payloads). Per way: calls/s and the p50 / p99 latency each caller saw; per protocol, the latency the router
adds (the median over rounds of routed minus direct p50 and p99). Results: a table on stdout and JSON in
bench/results/protocols_bench.json.

Subcommand used by the run: `agent --port P --grpc-port G --registry URL --broker URL` (the SDK agent serving
bench.atp, bench.ws, bench.grpc and bench.mq).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import msgspec
import redis.asyncio as aioredis
from agent_reach import AgentReachSDK, logs
from agent_reach.grpc_wire import CALL_METHOD
from agent_reach.headers import DEADLINE_HEADER, REPLY_TO_HEADER, REQUEST_ID_HEADER
from agent_reach.proto.agent_pb2 import CallReply, CallRequest
from agent_reach.redis_broker import RedisBroker
from agent_reach.socket_wire import Envelope, decode, encode

from common import (
    RESULTS,
    ROUTER_BENCH,
    cpu_seconds,
    family_cpu_seconds,
    free_port,
    keep_alive,
    machine,
    rank_at,
    spawn,
    stop_processes,
    wait_http,
)

PAYLOAD = {"text": "x" * 1000}
Call = Callable[[], Awaitable[None]]


MQ_STREAM = "agentreach.bench-sdk.bench.mq"  # the SDK's default: agentreach.<service>.<capability>


def agent_main(port: int, grpc_port: int, registry: str, broker: str) -> None:
    logs.configure()
    sdk = AgentReachSDK(agent_id="bench-sdk-1", registry_url=registry, zone="bench", service="bench-sdk",
                        heartbeat_interval=2.0, grpc_port=grpc_port, broker=broker)

    async def echo(payload: Any, ctx: Any) -> Any:
        return {"echo": payload}

    sdk.capability("bench.atp")(echo)
    sdk.capability("bench.ws", protocol="websocket")(echo)
    sdk.capability("bench.grpc", protocol="grpc")(echo)
    sdk.capability("bench.mq", protocol="mq", stream=MQ_STREAM)(echo)
    sdk.serve("127.0.0.1", port)


class SocketCaller:
    """A caller multiplexing calls on one WebSocket to the agent, as the router does."""

    def __init__(self, session: aiohttp.ClientSession, url: str):
        self.session, self.url = session, url
        self.waiting: dict[str, asyncio.Future[bytes]] = {}
        self.ids = itertools.count()

    async def open(self) -> None:
        self.socket = await self.session.ws_connect(self.url, max_msg_size=0)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            envelope, body = decode(message.data)
            self.waiting.pop(envelope.id).set_result(body)

    async def call(self) -> None:
        call_id = f"direct-{next(self.ids)}"
        body = json.dumps({"capability": "bench.ws", "payload": PAYLOAD, "request_id": call_id}).encode()
        self.waiting[call_id] = asyncio.get_running_loop().create_future()
        await self.socket.send_bytes(encode(Envelope(type="call", id=call_id), body))
        answer = json.loads(await asyncio.wait_for(self.waiting[call_id], 10))
        assert answer["status"] == "success", answer

    async def close(self) -> None:
        self.reader.cancel()
        await self.socket.close()


class GrpcCaller:
    """A caller of the agent's gRPC server on one channel, as the router does."""

    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address)
        self.request = CallRequest(capability="bench.grpc", payload=msgspec.json.encode(PAYLOAD)).SerializeToString()
        self.unary = self.channel.unary_unary(CALL_METHOD)

    async def call(self) -> None:
        try:
            reply = CallReply.FromString(await self.unary(self.request, timeout=5))
        except grpc.aio.AioRpcError as exc:
            raise AssertionError(f"gRPC {exc.code().name}: {exc.details()}") from None
        assert reply.result.startswith(b'{"echo"'), reply

    async def close(self) -> None:
        await self.channel.close()


class MqCaller:
    """A caller appending to the agent's request stream and reading its own reply stream, as the router does:
    one reader hands each answer to its call by id, and drops the entries it read."""

    def __init__(self, broker: str):
        self.broker = RedisBroker(broker)
        self.reply_stream = f"bench.replies.{time.monotonic_ns()}"
        self.waiting: dict[str, asyncio.Future[bytes]] = {}
        self.ids = itertools.count()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        after = "0-0"
        while True:
            entries = await self.broker.read(self.reply_stream, after, 1.0, 512)
            if entries:
                after = entries[-1].id
                await self.broker.forget(self.reply_stream, after, 3600)
            for entry in entries:
                envelope, body = decode(entry.message)
                self.waiting.pop(envelope.id).set_result(body)

    async def call(self) -> None:
        call_id = f"direct-{next(self.ids)}"
        body = json.dumps({"capability": "bench.mq", "payload": PAYLOAD, "request_id": call_id}).encode()
        headers = {REQUEST_ID_HEADER: call_id, REPLY_TO_HEADER: self.reply_stream,
                   DEADLINE_HEADER: str(int((time.time() + 10) * 1000))}
        self.waiting[call_id] = asyncio.get_running_loop().create_future()
        await self.broker.publish(MQ_STREAM, encode(Envelope(type="call", id=call_id, headers=headers), body))
        answer = json.loads(await asyncio.wait_for(self.waiting[call_id], 10))
        assert answer["status"] == "success", answer

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.broker.close()


@contextlib.contextmanager
def redis_server(port: int, directory: str) -> Iterator[str]:
    """redis-server on loopback with nothing persisted, until the block ends; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("protocols_bench.py needs redis-server: apt-get install redis-server")
    process = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", directory,
                                "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        stop_processes([process])


async def wait_redis(url: str, timeout: float = 30) -> None:
    client = aioredis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if await client.ping():
                    return
            except (OSError, aioredis.ConnectionError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not come up") from None
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()


def poster(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Call:
    data = json.dumps(body).encode()

    async def call() -> None:
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
            await response.read()
            assert response.status == 200, (url, response.status)
    return call


async def alternating(ways: dict[str, Call], rounds: int, seconds: float, concurrency: int,
                      pids: dict[str, int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each way measured once per round, the order reversed every other round so no way always goes first;
    with ``pids``, each run also has the CPU a call cost the way's process (``own_cpu_us``) and the process
    with its children (``cpu_us``: an audit writer, an exporter)."""
    results: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    order = list(ways)
    for n in range(rounds):
        for way in order if n % 2 == 0 else reversed(order):
            pid = pids.get(way) if pids is not None else None
            before = (cpu_seconds(pid), family_cpu_seconds(pid)) if pid is not None else (0.0, 0.0)
            run = await measure(ways[way], seconds, concurrency)
            if pid is not None:
                run["own_cpu_us"] = (cpu_seconds(pid) - before[0]) / run["calls"] * 1e6
                run["cpu_us"] = (family_cpu_seconds(pid) - before[1]) / run["calls"] * 1e6
            results[way].append(run)
    return results


async def measure(call: Call, seconds: float, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    ends_at = time.monotonic() + seconds

    async def worker() -> None:
        while (started := time.monotonic()) < ends_at:
            await call()
            latencies.append(time.monotonic() - started)

    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - began
    latencies.sort()
    return {"calls_per_s": len(latencies) / elapsed, "p50_ms": rank_at(latencies, 0.5) * 1000,
            "p99_ms": rank_at(latencies, 0.99) * 1000, "calls": len(latencies)}


async def run(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    ports = {name: free_port() for name in ("rest", "sdk", "grpc", "registry", "router", "redis")}
    registry, router = (f"http://127.0.0.1:{ports[name]}" for name in ("registry", "router"))
    rest, sdk = (f"http://127.0.0.1:{ports[name]}" for name in ("rest", "sdk"))
    with tempfile.TemporaryDirectory() as data_dir, redis_server(ports["redis"], data_dir) as broker:
        processes = [
            spawn("-m", "agentreach.cli", "registry", "--port", str(ports["registry"]), "--data-dir", data_dir,
                  "--log-level", "warning", "--auth", "off", "--silence-timeout", "3600"),
            spawn("-m", "agentreach.cli", "router", "--port", str(ports["router"]), "--registry", registry,
                  "--log-level", "warning", "--auth", "off", "--data-dir", data_dir, "--no-audit",
                  "--broker", broker),
            spawn(str(ROUTER_BENCH), "echo", "--port", str(ports["rest"])),
        ]
        beating: asyncio.Task[None] | None = None
        try:
            await wait_http(f"{registry}/healthz")
            await wait_redis(broker)
            processes.append(spawn(__file__, "agent", "--port", str(ports["sdk"]), "--grpc-port", str(ports["grpc"]),
                                   "--registry", registry, "--broker", broker))
            for url in (f"{router}/healthz", f"{rest}/healthz", f"{sdk}/healthz"):
                await wait_http(url)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                registration = {"agent_id": "bench-rest-1", "service": "bench-rest", "capabilities": [
                    {"name": "bench.rest", "protocol": "rest", "endpoint": f"{rest}/echo", "timeout_sla_ms": 5000}]}
                async with session.post(f"{registry}/register", json=registration) as response:
                    response.raise_for_status()
                beating = asyncio.create_task(keep_alive(registry, "bench-rest-1"))
                socket = SocketCaller(session, f"{sdk}/ws/bench.ws")
                await socket.open()
                channel = GrpcCaller(f"127.0.0.1:{ports['grpc']}")
                queue = MqCaller(broker)
                ways = {
                    "rest.direct": poster(session, f"{rest}/echo", PAYLOAD),
                    "rest.router": poster(session, f"{router}/atp", {"capability": "bench.rest", "payload": PAYLOAD}),
                    "atp.direct": poster(session, f"{sdk}/atp/bench.atp", {"capability": "bench.atp",
                                                                           "payload": PAYLOAD}),
                    "atp.router": poster(session, f"{router}/atp", {"capability": "bench.atp", "payload": PAYLOAD}),
                    "websocket.direct": socket.call,
                    "websocket.router": poster(session, f"{router}/atp", {"capability": "bench.ws",
                                                                          "payload": PAYLOAD}),
                    "grpc.direct": channel.call,
                    "grpc.router": poster(session, f"{router}/atp", {"capability": "bench.grpc", "payload": PAYLOAD}),
                    "mq.direct": queue.call,
                    "mq.router": poster(session, f"{router}/atp", {"capability": "bench.mq", "payload": PAYLOAD}),
                }
                await until_routable(ways)
                results = await alternating(ways, rounds, seconds, concurrency)
                await socket.close()
                await channel.close()
                await queue.close()
        finally:
            if beating is not None:
                beating.cancel()
            stop_processes(processes)
    return summarize(results, rounds, seconds, concurrency)


async def until_routable(ways: dict[str, Call], timeout: float = 30) -> None:
    """Every way answers (the router has loaded every instance healthy)."""
    deadline = time.monotonic() + timeout
    for call in ways.values():
        while True:
            try:
                await call()
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


def summarize(results: dict[str, list[dict[str, Any]]], rounds: int, seconds: float,
              concurrency: int) -> dict[str, Any]:
    ways = {way: {key: statistics.median(run[key] for run in runs) for key in ("calls_per_s", "p50_ms", "p99_ms")}
            for way, runs in results.items()}
    added = {}
    for protocol in dict.fromkeys(way.split(".")[0] for way in results):
        routed, direct = results[f"{protocol}.router"], results[f"{protocol}.direct"]
        added[protocol] = {
            "p50_ms": statistics.median(r["p50_ms"] - d["p50_ms"] for r, d in zip(routed, direct, strict=True)),
            "p99_ms": statistics.median(r["p99_ms"] - d["p99_ms"] for r, d in zip(routed, direct, strict=True)),
            "router_over_direct_calls": statistics.median(
                r["calls_per_s"] / d["calls_per_s"] for r, d in zip(routed, direct, strict=True))}
    return {"machine": machine(), "rounds": rounds, "seconds": seconds, "concurrency": concurrency,
            "payload_bytes": len(json.dumps(PAYLOAD)), "ways": ways, "added_by_router": added, "raw": results}


def report(summary: dict[str, Any]) -> None:
    print(f"{summary['rounds']} rounds x {summary['seconds']} s per way, {summary['concurrency']} calls in flight, "
          f"{summary['payload_bytes']} B payload; medians over rounds")
    print(f"{'way':<18}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for way, figures in summary["ways"].items():
        print(f"{way:<18}{figures['calls_per_s']:>10.0f}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}")
    print(f"\n{'added by router':<18}{'p50 ms':>10}{'p99 ms':>10}{'calls/s ratio':>15}")
    for protocol, figures in summary["added_by_router"].items():
        print(f"{protocol:<18}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}"
              f"{figures['router_over_direct_calls']:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    agent = commands.add_parser("agent")
    agent.add_argument("--port", type=int, required=True)
    agent.add_argument("--grpc-port", type=int, required=True)
    agent.add_argument("--registry", required=True)
    agent.add_argument("--broker", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.command == "agent":
        agent_main(args.port, args.grpc_port, args.registry, args.broker)
        return
    summary = asyncio.run(run(args.rounds, args.seconds, args.concurrency))
    report(summary)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "protocols_bench.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
