"""The contract's floor: the least a router does per call, none of the router's own code around it.

`python bench/floor_router.py --port P --upstream URL --api-key KEY [--audit PATH] [--server uvicorn]`.
Issue 18 asks the default router (auth, audit trail, signed forwards) for 0.85x the bare pass-through
proxy's calls/s. This server does, per call, only what that contract itself demands, each step one
library call, with no routing (one upstream), no breakers, budgets, rules, metrics, traces or logs:

  the frame decoded (its payload left as raw JSON) and its request id checked, the caller's API key looked
  up in a dict (the router's cache hit), a request id and a trace id made, the payload sent upstream with
  the request id, a traceparent and an HMAC signature (agent_reach.signing) under a deadline, the answer
  read within the router's cap (router.transports.http's reader) and framed, failures answered as ATP error frames,
  and (with --audit) the call's audit row built by router.audit and recorded in the product's own AuditLog
  (its writer process, its SQLite file).

Served by aiohttp (as the router is) or, with `--server uvicorn`, by uvicorn's httptools protocol on uvloop,
the fastest Python server measured at the bare proxy (bench/stack_bench.py); the client is aiohttp's either
way. bench/datapath_bench.py runs it beside the bare proxy and the default router: whatever the router's
own code costs, a router cannot beat this floor on the same stack.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from agent_reach.atp import ErrorCode, ErrorFrame, error_frame, new_request_id, valid_request_id
from agent_reach.headers import API_KEY_HEADER, REQUEST_ID_HEADER, SIGNATURE_HEADER, TRACEPARENT_HEADER
from agent_reach.signing import sign
from aiohttp import web
from yarl import URL

from common import asgi_body, asgi_json_answer
from router.api import DEFAULT_MAX_BODY
from router.audit import AuditLog, call_entry
from router.transports.base import DEFAULT_MAX_ANSWER_BYTES
from router.transports.http import read_capped

DEADLINE_S = 5.0
AGENT_ID = "echo-1"


class Frame(msgspec.Struct):
    capability: str
    payload: msgspec.Raw = msgspec.Raw(b"null")
    request_id: str | None = None


class Answer(msgspec.Struct):
    request_id: str
    status: str
    result: msgspec.Raw


_frame_decoder = msgspec.json.Decoder(Frame)
_encoder = msgspec.json.Encoder()
API_KEY_NAME = API_KEY_HEADER.lower().encode()  # as ASGI hands header names over


def failure(frame: ErrorFrame) -> tuple[int, bytes]:
    return frame.error_code.http_status, _encoder.encode(frame)


class Floor:
    """The contract's work for one call, whichever server hands it the request."""

    def __init__(self, upstream: str, api_key: str, signing_key: str, audit_path: Path | None):
        self.upstream, self.path = upstream, URL(upstream).path
        self.callers = {api_key: "bench"}
        self.signing_key = signing_key
        self.audit_path = audit_path
        self.audit: AuditLog | None = None
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))
        if self.audit_path is not None:
            self.audit = AuditLog(self.audit_path, retention_days=30.0)
            await self.audit.start()

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.audit is not None:
            await self.audit.stop()

    async def call(self, api_key: str | None, request: bytes) -> tuple[int, bytes]:
        """The status and body to answer a POST /atp carrying ``api_key`` and ``request``; every forwarded
        call gets its audit row, failed ones included (the router's row for a refusal is left out: the
        floor measures calls that are made)."""
        started, started_at = time.monotonic(), time.time()
        try:
            frame = _frame_decoder.decode(request)
        except (msgspec.MsgspecError, RecursionError) as exc:
            return failure(error_frame(new_request_id(), ErrorCode.INVALID_FRAME, f"not a frame: {exc}"))
        if frame.request_id is not None and not valid_request_id(frame.request_id):
            return failure(error_frame(new_request_id(), ErrorCode.INVALID_FRAME,
                                       "request_id must be 1 to 128 visible ASCII characters", "request_id"))
        request_id, trace_id, body = frame.request_id or new_request_id(), new_request_id(), bytes(frame.payload)
        caller = self.callers.get(api_key or "")
        if caller is None:
            return failure(error_frame(request_id, ErrorCode.UNAUTHENTICATED,
                                       f"send the caller's key as {API_KEY_HEADER}"))
        answer = await self._forward(request_id, trace_id, body)
        if self.audit is not None:
            code = answer.error_code if isinstance(answer, ErrorFrame) else None
            self.audit.record(call_entry(
                started_at=started_at, capability=frame.capability, request_id=request_id,
                outcome="success" if code is None else "failed", error_code=code,
                latency_ms=(time.monotonic() - started) * 1000, caller_id=caller, caller_name=caller,
                auth_method="api_key", tried=[], trace_id=trace_id, parent_request_id=None,
                payload_bytes=len(body), payload_sha256=hashlib.sha256(body).hexdigest(), rule=None, usage=None,
                streamed=False, chunks=0, chunk_bytes=0))
        if isinstance(answer, ErrorFrame):
            return failure(answer)
        return 200, _encoder.encode(Answer(request_id, "success", msgspec.Raw(answer)))

    async def _forward(self, request_id: str, trace_id: str, body: bytes) -> bytes | ErrorFrame:
        """The agent's answer, read within the router's answer cap (router.transports.http's reader), or why not."""
        assert self.session is not None, "Floor.start() first"
        headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: request_id,
                   TRACEPARENT_HEADER: f"00-{trace_id}-{os.urandom(8).hex()}-01",
                   SIGNATURE_HEADER: sign(self.signing_key, AGENT_ID, "POST", self.path, request_id, body)}
        try:
            async with asyncio.timeout(DEADLINE_S):
                async with self.session.post(self.upstream, data=body, headers=headers,
                                             allow_redirects=False) as answer:
                    result = await read_capped(answer, DEFAULT_MAX_ANSWER_BYTES)
                    status = answer.status
        except TimeoutError:
            return error_frame(request_id, ErrorCode.TOTAL_TIMEOUT, f"no answer within {DEADLINE_S:g} s")
        except aiohttp.ClientError as exc:
            return error_frame(request_id, ErrorCode.AGENT_ERROR, f"agent connection broke: {exc!r}")
        if result is None:
            return error_frame(request_id, ErrorCode.ANSWER_TOO_LARGE,
                               f"agent's answer exceeds {DEFAULT_MAX_ANSWER_BYTES} bytes")
        if status // 100 != 2:
            return error_frame(request_id, ErrorCode.AGENT_ERROR, f"agent answered HTTP {status}")
        return result


def floor_app(floor: Floor) -> web.Application:
    """The floor served by aiohttp, as the router is."""
    async def atp(request: web.Request) -> web.Response:
        status, body = await floor.call(request.headers.get(API_KEY_HEADER), await request.read())
        return web.Response(body=body, status=status, content_type="application/json")

    async def start(app: web.Application) -> None:
        await floor.start()

    async def stop(app: web.Application) -> None:
        await floor.stop()

    app = web.Application(client_max_size=DEFAULT_MAX_BODY)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/atp", atp)
    return app


class AsgiFloor:
    """The floor as a raw ASGI application, for uvicorn on its httptools protocol."""

    def __init__(self, floor: Floor):
        self.floor = floor

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if (scope["method"], scope["path"]) != ("POST", "/atp"):
            await asgi_json_answer(send, 404, b'{"error":"not_found"}')
            return
        api_key = next((value.decode("latin-1") for name, value in scope["headers"] if name == API_KEY_NAME), None)
        request = await asgi_body(receive, DEFAULT_MAX_BODY)
        if request is None:
            answer = failure(error_frame(new_request_id(), ErrorCode.PAYLOAD_TOO_LARGE,
                                         f"a frame is {DEFAULT_MAX_BODY} bytes at most"))
        else:
            answer = await self.floor.call(api_key, request)
        await asgi_json_answer(send, *answer)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.floor.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.floor.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the echo agent's rest endpoint")
    parser.add_argument("--api-key", required=True, help="the one caller's API key")
    parser.add_argument("--audit", type=Path, help="keep an audit trail in this SQLite file")
    parser.add_argument("--server", choices=("aiohttp", "uvicorn"), default="aiohttp",
                        help="uvicorn: its httptools protocol on uvloop (needs the bench extra)")
    args = parser.parse_args()
    floor = Floor(args.upstream, args.api_key, os.urandom(32).hex(), args.audit)
    if args.server == "uvicorn":
        import uvicorn
        uvicorn.run(AsgiFloor(floor), host="127.0.0.1", port=args.port, http="httptools", loop="uvloop",
                    lifespan="on", access_log=False, log_level="warning")
    else:
        web.run_app(floor_app(floor), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
