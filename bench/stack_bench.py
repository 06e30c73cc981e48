"""Would a faster HTTP stack carry the router past aiohttp? One command: `python bench/stack_bench.py`.

Issue 18 asks to try serving and forwarding on a faster stack before porting the router to one, and
to adopt a stack only for a gain of at least 1.3x measured side by side. The router's own work (auth,
planning, tracing) runs in Python whatever carries its bytes, so the question is first asked of the
floor: the same bare pass-through proxy (read the body, POST it upstream over a keep-alive pool,
answer with the upstream's body) on five server/client pairs, against one echo agent:

  aiohttp+aiohttp     the bare proxy of bench/router_bench.py: what the router runs on today
  uvicorn+aiohttp     uvicorn's httptools protocol (llhttp, as a raw ASGI app) in front, aiohttp's client behind
  granian+aiohttp     Granian's Rust HTTP server (RSGI) in front, aiohttp's client behind
  aiohttp+pyreqwest   aiohttp's server, pyreqwest's Rust (reqwest/hyper) client behind
  granian+pyreqwest   Rust on both sides, Python only in between

and with `--uvloop` each Python event loop on uvloop (with `--uvloop-pair PAIR`, that pair also runs on uvloop
beside the rest on asyncio's loop). wrk -c 64, rounds alternating the pairs (order
reversed every other round), the best round counting; CPU per call over the serving process and its
children. Ratios to aiohttp+aiohttp come from the same run. Needs the `bench` extra
(`pip install -e '.[bench]'`): these stacks are measured, not dependencies of the mesh.
Results: a table on stdout, JSON in bench/results/stack_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from common import (
    RESULTS,
    ROUTER_BENCH,
    alternating_rounds,
    asgi_body,
    asgi_json_answer,
    best_rounds,
    free_port,
    load_average,
    machine,
    require,
    spawn,
    stop_processes,
    wait_http,
    wrk_max,
)

PAIRS = ("aiohttp+aiohttp", "uvicorn+aiohttp", "granian+aiohttp", "aiohttp+pyreqwest", "granian+pyreqwest")
# A pair named with this suffix (--uvloop-pair) runs on uvloop beside the others on asyncio's own loop.
ON_UVLOOP = "@uvloop"
BODY = b'{"text":"' + b"x" * (1024 - 11) + b'"}'  # 1 KB, as issue 18's bar is stated
MAX_BODY = 1 << 20  # a request's body at most, aiohttp's default


# --- the proxies: one way to forward, two ways to serve ----------------------------------------

class AiohttpForward:
    """POST the body upstream with aiohttp's client; the upstream's body back."""

    def __init__(self, upstream: str):
        import aiohttp
        self._upstream = upstream
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))

    async def __call__(self, body: bytes) -> tuple[int, bytes]:
        async with self._session.post(self._upstream, data=body,
                                      headers={"Content-Type": "application/json"}) as answer:
            return answer.status, await answer.read()

    async def close(self) -> None:
        await self._session.close()


class PyreqwestForward:
    """The same with pyreqwest's client (reqwest and hyper, in Rust, on their own runtime)."""

    def __init__(self, upstream: str):
        from pyreqwest.client import ClientBuilder
        self._upstream = upstream
        self._client = ClientBuilder().http1_only().pool_max_idle_per_host(256).build()

    async def __call__(self, body: bytes) -> tuple[int, bytes]:
        request = self._client.post(self._upstream).header("Content-Type", "application/json").body_bytes(body)
        answer = await request.build().send()
        return answer.status, bytes(await answer.bytes())

    async def close(self) -> None:
        await self._client.close()


FORWARDS = {"aiohttp": AiohttpForward, "pyreqwest": PyreqwestForward}


def aiohttp_server(client: str, upstream: str, port: int) -> None:
    forward: list[Any] = []

    async def startup(app: web.Application) -> None:
        forward.append(FORWARDS[client](upstream))

    async def cleanup(app: web.Application) -> None:
        await forward[0].close()

    async def handle(request: web.Request) -> web.Response:
        status, body = await forward[0](await request.read())
        return web.Response(body=body, status=status, content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_post("/{tail:.*}", handle)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class ServedProxy:
    """The proxy for a server that imports its application (Granian, uvicorn): the client named by the
    environment, built on the server's loop at the first call."""

    def __init__(self) -> None:
        self._forward: Any = None

    async def forward(self, body: bytes) -> tuple[int, bytes]:
        if self._forward is None:
            self._forward = FORWARDS[os.environ["STACK_CLIENT"]](os.environ["STACK_UPSTREAM"])
        return await self._forward(body)


class RsgiProxy(ServedProxy):
    """As an RSGI application, for Granian (`granian --interface rsgi stack_bench:rsgi_app`)."""

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.method == "GET":
            protocol.response_bytes(200, [("content-type", "application/json")], b'{"ok":true}')
            return
        status, body = await self.forward(await protocol())
        protocol.response_bytes(status, [("content-type", "application/json")], body)


class AsgiProxy(ServedProxy):
    """As a raw ASGI application (no framework), for uvicorn (`uvicorn --http httptools stack_bench:asgi_app`)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["method"] == "GET":
            await asgi_json_answer(send, 200, b'{"ok":true}')
            return
        body = await asgi_body(receive, MAX_BODY)
        await asgi_json_answer(send, *(await self.forward(body) if body is not None else (413, b'{"ok":false}')))


rsgi_app = RsgiProxy()
asgi_app = AsgiProxy()
# The servers that import their application: how each is started (its options, then the app).
SERVED = {
    "uvicorn": (["uvicorn", "--http", "httptools", "--lifespan", "off", "--no-access-log"], "stack_bench:asgi_app"),
    "granian": (["granian", "--interface", "rsgi", "--workers", "1", "--no-ws"], "stack_bench:rsgi_app"),
}


def serve_command(pair: str, upstream: str, port: int, uvloop: bool) -> subprocess.Popen:
    """``pair`` is server+client, with `@uvloop` when that pair alone runs on uvloop."""
    pair, on_uvloop = pair.removesuffix(ON_UVLOOP), pair.endswith(ON_UVLOOP)
    uvloop = uvloop or on_uvloop
    server, client = pair.split("+")
    if server == "aiohttp":
        args = [__file__, "serve", "--client", client, "--upstream", upstream, "--port", str(port)]
        if uvloop:
            args.append("--uvloop")
        return spawn(*args)
    env_args = {"STACK_CLIENT": client, "STACK_UPSTREAM": upstream}
    options, app = SERVED[server]
    return subprocess.Popen([sys.executable, "-m", *options, "--loop", "uvloop" if uvloop else "asyncio",
                             "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port), app],
                            cwd=Path(__file__).parent, stdout=subprocess.DEVNULL, env={**os.environ, **env_args})


async def run(args: argparse.Namespace) -> dict[str, Any]:
    require("wrk")
    pairs = PAIRS + tuple(f"{pair}{ON_UVLOOP}" for pair in args.uvloop_pair)
    ports = {name: free_port() for name in ("echo", *pairs)}
    echo = f"http://127.0.0.1:{ports['echo']}"
    processes = [spawn(ROUTER_BENCH, "echo", "--port", str(ports["echo"]))]
    try:
        await wait_http(f"{echo}/healthz")
        servers = {pair: serve_command(pair, f"{echo}/echo", ports[pair], args.uvloop) for pair in pairs}
        processes += servers.values()
        for pair in pairs:
            await wait_http(f"http://127.0.0.1:{ports[pair]}/healthz")
        load_before = load_average()
        targets = {pair: (lambda seconds, pair=pair: wrk_max(f"http://127.0.0.1:{ports[pair]}/echo", BODY, seconds,
                                                           servers[pair].pid)) for pair in pairs}
        best = best_rounds(await alternating_rounds(targets, args.rounds, args.seconds))
    finally:
        stop_processes(processes)
    floor = best["aiohttp+aiohttp"]
    for figures in best.values():
        figures["vs_aiohttp_rps"] = figures["rps"] / floor["rps"]
        figures["vs_aiohttp_cpu"] = floor["cpu_us_per_call"] / figures["cpu_us_per_call"]
    return {"machine": machine(load_before=load_before, load_after=load_average()), "uvloop": args.uvloop,
            "body_bytes": len(BODY), "rounds": args.rounds, "seconds": args.seconds, "pairs": best}


def report(result: dict[str, Any]) -> None:
    print(f"bare pass-through proxy, 1 KB bodies, wrk -c 64, best of {result['rounds']} alternating rounds"
          f"{' (uvloop)' if result['uvloop'] else ''}; load {result['machine']['load_before']}")
    print(f"{'server+client':>20} {'calls/s':>9} {'x aiohttp':>10} {'CPU us/call':>12} {'x by CPU':>9}")
    for pair, figures in result["pairs"].items():
        print(f"{pair:>20} {figures['rps']:9.0f} {figures['vs_aiohttp_rps']:9.2f}x {figures['cpu_us_per_call']:12.1f} "
              f"{figures['vs_aiohttp_cpu']:8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run one aiohttp-served proxy (the bench starts these itself)")
    serve.add_argument("--client", choices=sorted(FORWARDS), required=True)
    serve.add_argument("--upstream", required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--uvloop", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--uvloop", action="store_true", help="every Python event loop on uvloop")
    parser.add_argument("--uvloop-pair", action="append", default=[], choices=PAIRS, metavar="PAIR",
                        help="also this pair on uvloop, beside the pairs on asyncio's loop (repeatable)")
    args = parser.parse_args()
    if args.command == "serve":
        if args.uvloop:
            import uvloop
            uvloop.install()
        aiohttp_server(args.client, args.upstream, args.port)
        return
    result = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stack_bench.json").write_text(json.dumps(result, indent=2))
    report(result)


if __name__ == "__main__":
    main()
