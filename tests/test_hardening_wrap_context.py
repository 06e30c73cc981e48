"""A FastAPI agent reads the router's context as sent: non-ASCII text in X-Reach-Context arrives whole
(the router writes the header in UTF-8, as aiohttp agents read it), and undecodable bytes never fail the call."""

from __future__ import annotations

from agent_reach import current, register_capability
from fastapi import FastAPI

from hardening_support import raw_request
from sdk_support import loopback_socket, run_uvicorn, wait_state

CONTEXT = {"session_id": "会话-1", "note": "你好，世界 — naïve café"}


def context_app(sdk) -> FastAPI:
    app = FastAPI()
    sdk.attach(app)

    @register_capability(sdk, name="ctx.echo", protocol="rest")
    @app.post("/ctx")
    async def show(body: dict):
        return {"context": current().context}

    return app


async def test_a_fastapi_agent_gets_chinese_context_through_the_router(registry, start_mesh, make_agent, http):
    sock = loopback_socket()
    sdk = make_agent("ctx-utf8-1", registry.url, base_url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    mesh = await start_mesh(registry=registry)
    async with run_uvicorn(context_app(sdk), sock):
        await wait_state(http, registry.url, "ctx-utf8-1", "healthy")
        await mesh.until_state("ctx-utf8-1")
        answer = await mesh.call("ctx.echo", {"k": 1}, context=CONTEXT)
    assert answer.status == 200, answer.body
    received = answer.body["result"]["context"]
    assert {key: received[key] for key in CONTEXT} == CONTEXT


async def test_undecodable_context_bytes_are_replaced_not_a_failure(registry, make_agent, http):
    sock = loopback_socket()
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sdk = make_agent("ctx-bytes-1", registry.url, base_url=base_url)
    async with run_uvicorn(context_app(sdk), sock):
        await wait_state(http, registry.url, "ctx-bytes-1", "healthy")
        answer = await raw_request(base_url, "POST", "/ctx", [(b"Content-Type", b"application/json"),
                                                              (b"X-Reach-Context", b'{"note": "\xff\xfe"}')],
                                   b'{"k": 1}')
    assert answer.status == 200, answer.body
    assert answer.json()["context"]["note"] == "\ufffd\ufffd"


async def test_an_aiohttp_agent_ignores_an_undecodable_context(registry, make_agent, http):
    """aiohttp hands undecodable header bytes on as surrogates; the context is dropped, the call is served."""
    from agent_reach.serving import listen
    from aiohttp import web

    port = loopback_socket().getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    sdk = make_agent("ctx-aio-bytes-1", registry.url, base_url=base_url)
    routes = web.RouteTableDef()

    @register_capability(sdk, name="ctx.aio", protocol="rest")
    @routes.post("/ctx")
    async def show(request: web.Request) -> web.Response:
        return web.json_response({"context": current().context})

    app = web.Application()
    app.add_routes(routes)
    sdk.attach(app)
    runner, _ = await listen(app, "127.0.0.1", port)
    try:
        await wait_state(http, registry.url, "ctx-aio-bytes-1", "healthy")
        answer = await raw_request(base_url, "POST", "/ctx", [(b"Content-Type", b"application/json"),
                                                              (b"X-Reach-Context", b'{"note": "\xff\xfe"}')],
                                   b'{"k": 1}')
    finally:
        await runner.cleanup()
    assert answer.status == 200, answer.body
    assert "note" not in answer.json()["context"]
