"""The contract's floor: the least a router on aiohttp does per call, none of the router's own code around it.

`python bench/floor_router.py --port P --upstream URL --api-key KEY [--audit PATH]`. Issue 18 asks the
default router (auth, audit trail, signed forwards) for 0.85x the bare pass-through proxy's calls/s. This
server does, per call, only what that contract itself demands, each step one library call, with no
routing (one upstream), no breakers, budgets, rules, metrics, traces or logs:

  the caller's API key looked up in a dict (the router's cache hit), the frame decoded (its payload left
  as raw JSON), a request id and a trace id made, the payload sent upstream with the request id, a
  traceparent and an HMAC signature (agent_reach.signing), under a deadline, the answer's length checked
  against a cap, the answer framed, and (with --audit) the call's audit row built by router.audit and
  recorded in the product's own AuditLog (its writer process, its SQLite file).

bench/datapath_bench.py runs it beside the bare proxy and the default router: whatever the router's own
code costs, a router cannot beat this floor on the same stack.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from pathlib import Path

import aiohttp
import msgspec
from agent_reach.atp import new_request_id
from agent_reach.headers import REQUEST_ID_HEADER, SIGNATURE_HEADER, TRACEPARENT_HEADER
from agent_reach.signing import sign
from aiohttp import web
from yarl import URL

from router.audit import AuditLog, call_entry

MAX_ANSWER_BYTES = 16 << 20
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
_answer_encoder = msgspec.json.Encoder()
SESSION = web.AppKey("session", aiohttp.ClientSession)
AUDIT = web.AppKey("audit", AuditLog)


def floor_app(upstream: str, api_key: str, signing_key: str, audit_path: Path | None) -> web.Application:
    callers = {api_key: "bench"}
    path = URL(upstream).path
    app = web.Application()

    async def open_clients(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))
        if audit_path is not None:
            app[AUDIT] = AuditLog(audit_path, retention_days=30.0)
            await app[AUDIT].start()

    async def close_clients(app: web.Application) -> None:
        await app[SESSION].close()
        if AUDIT in app:
            await app[AUDIT].stop()

    async def atp(request: web.Request) -> web.Response:
        started, started_at = time.monotonic(), time.time()
        caller = callers.get(request.headers.get("X-API-Key", ""))
        if caller is None:
            return web.json_response({"error_code": "UNAUTHENTICATED"}, status=401)
        frame = _frame_decoder.decode(await request.read())
        request_id = frame.request_id or new_request_id()
        trace_id = new_request_id()
        body = bytes(frame.payload)
        headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: request_id,
                   TRACEPARENT_HEADER: f"00-{trace_id}-{os.urandom(8).hex()}-01",
                   SIGNATURE_HEADER: sign(signing_key, AGENT_ID, "POST", path, request_id, body)}
        async with asyncio.timeout(DEADLINE_S):
            async with app[SESSION].post(upstream, data=body, headers=headers, allow_redirects=False) as answer:
                if (answer.content_length or 0) > MAX_ANSWER_BYTES:
                    return web.json_response({"error_code": "ANSWER_TOO_LARGE"}, status=502)
                result = await answer.read()
        if AUDIT in app:
            app[AUDIT].record(call_entry(
                started_at=started_at, capability=frame.capability, request_id=request_id, outcome="success",
                error_code=None, latency_ms=(time.monotonic() - started) * 1000, caller_id=caller,
                caller_name=caller, auth_method="api_key", tried=[], trace_id=trace_id, parent_request_id=None,
                payload_bytes=len(body), payload_sha256=hashlib.sha256(body).hexdigest(), rule=None, usage=None,
                streamed=False, chunks=0, chunk_bytes=0))
        return web.Response(body=_answer_encoder.encode(Answer(request_id, "success", msgspec.Raw(result))),
                            content_type="application/json")

    app.on_startup.append(open_clients)
    app.on_cleanup.append(close_clients)
    app.router.add_post("/atp", atp)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the echo agent's rest endpoint")
    parser.add_argument("--api-key", required=True, help="the one caller's API key")
    parser.add_argument("--audit", type=Path, help="keep an audit trail in this SQLite file")
    args = parser.parse_args()
    web.run_app(floor_app(args.upstream, args.api_key, os.urandom(32).hex(), args.audit), host="127.0.0.1",
                port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
