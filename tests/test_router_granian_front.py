"""`--http-front granian`: the router's own tests of POST /atp (calls, JSON-RPC, refusals, streams, the
caller leaving) run again against a router whose public port is Granian's, and the paths Granian passes
through to the aiohttp app (health, metrics, operator endpoints with and without the admin key).

`start_mesh` is overridden here, so the shared `mesh` and `secure` fixtures start their router behind Granian.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from agent_reach.connections import Limits

import test_router_api as api
import test_router_auth as auth
import test_stream_cancel as cancel
import test_stream_router as streams
import test_workers as workers
from conftest import admin_key
from router.api import DEFAULT_MAX_BODY, create_app
from router.front import GranianFront
from router.server import RouterServer, RouterServerSettings
from router_support import Mesh, StartMesh
from sdk_support import free_port, issue_token

GRANIAN = {"http_front": "granian"}


@pytest.fixture
def start_mesh(start_mesh: StartMesh) -> StartMesh:
    async def start(**options) -> Mesh:
        settings = {**options.pop("router_settings", {}), **GRANIAN}
        mesh = await start_mesh(**options, router_settings=settings)
        async with mesh.http.get(f"{mesh.url}/healthz") as response:
            assert response.headers["Server"] == "granian"  # not aiohttp's answering on the port
        return mesh
    return start


async def test_a_call_routes_with_its_context(mesh, start_agent):
    await api.test_a_rest_agent_gets_the_payload_and_the_context_in_headers(mesh, start_agent)


async def test_the_route_facts_come_as_headers_when_asked(mesh, start_agent):
    await api.test_the_route_facts_come_as_headers_too_when_asked(mesh, start_agent)


async def test_jsonrpc_single_calls(mesh, start_agent):
    await api.test_jsonrpc_single_call_and_ids_preserved(mesh, start_agent)


async def test_jsonrpc_batches_and_notifications(mesh, start_agent):
    await api.test_jsonrpc_batches_and_notifications(mesh, start_agent)


@pytest.mark.parametrize(("raw", "status", "code"), api.BAD_FRAMES)
async def test_bad_input_is_an_error_frame(start_mesh, start_agent, raw, status, code):
    await api.test_bad_input_is_an_error_frame_and_nothing_is_forwarded(start_mesh, start_agent, raw, status, code)


async def test_an_oversize_body_is_refused_and_get_atp_passes_through(start_mesh):
    await api.test_an_invalid_frame_keeps_the_callers_request_id_and_oversize_bodies_are_refused(start_mesh)


async def test_a_chunked_body_is_refused_once_past_the_limit(start_mesh):
    mesh: Mesh = await start_mesh(max_body=4096)

    async def chunked(size: int) -> AsyncIterator[bytes]:
        yield b'{"capability": "echo", "payload": "'
        for _ in range(size // 1000):
            yield b"x" * 1000
        yield b'"}'

    for size, status, code in ((2000, 404, "UNKNOWN_CAPABILITY"), (9000, 413, "PAYLOAD_TOO_LARGE")):
        async with mesh.http.post(f"{mesh.url}/atp", data=chunked(size)) as response:
            assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
            body = await response.json()
            assert (response.status, body["error_code"]) == (status, code)
            assert response.headers["X-Request-Id"] == body["request_id"]


async def test_oversized_headers_get_a_json_431_on_atp_and_on_passed_through_paths(mesh, start_agent):
    await mesh.add(await start_agent("echo-1"))
    assert (await mesh.call(headers={"X-Note": "n" * 7000})).status == 200
    for path in ("/atp", "/completions"):
        async with mesh.http.post(f"{mesh.url}{path}", json={"capability": "echo"},
                                  headers={"X-Note": "n" * 4000, "X-More": "m" * 4200}) as response:
            body = await response.json()
            assert (response.status, body["error"], body["field"]) == (431, "headers_too_large", "headers"), path
            assert "8192" in body["message"]


async def test_auth_refusals_rate_limits_and_open_paths(secure):
    await auth.test_a_call_without_a_credential_is_refused_unforwarded_and_traced(secure)
    await auth.test_a_client_over_its_rate_gets_429_with_retry_after_and_recovers(secure)
    await auth.test_health_metrics_jwks_and_completions_stay_open(secure)


@pytest.mark.parametrize("path", ["/reach", "/traces/abc"])
async def test_operator_endpoints_pass_through_with_the_admin_key_only(secure, path):
    await auth.test_operator_endpoints_need_the_admin_key(secure, path)


async def test_a_streamed_answer_reaches_the_caller_chunk_by_chunk(mesh, make_agent, http):
    await streams.test_each_chunk_reaches_the_caller_while_the_agent_is_still_producing(mesh, make_agent, http)
    await streams.test_a_call_refused_before_any_chunk_keeps_its_status(mesh, http)


async def test_the_caller_leaving_cancels_the_agents_call(mesh, make_agent, http):
    await cancel.test_a_caller_leaving_mid_stream_cancels_the_handler_within_a_second(mesh, make_agent, http)
    await cancel.test_a_caller_leaving_while_the_handler_is_silent_cancels_it_too(mesh, make_agent, http)


async def test_the_port_is_shared_only_when_asked(registry):
    """Granian sets SO_REUSEPORT on sockets it binds itself; the front binds its own, so a second router
    on a taken port fails as with aiohttp, and `--workers N` (reuse_port) still shares it."""
    routers: list[RouterServer] = []
    try:
        for reuse_port in (False, True):
            first = RouterServer(RouterServerSettings(port=0, auth=False, reuse_port=reuse_port, **GRANIAN),
                                 hub=registry.hub)
            routers.append(first)
            await first.start()
            second = RouterServer(RouterServerSettings(port=first.port, auth=False, reuse_port=reuse_port, **GRANIAN),
                                  hub=registry.hub)
            routers.append(second)
            if reuse_port:
                await second.start()
                assert second.port == first.port
            else:
                with pytest.raises(OSError, match="in use"):
                    await second.start()
    finally:
        for router in routers:
            await router.stop()


async def test_the_router_command_runs_two_granian_workers_on_one_port(start_registry, start_agent, http, tmp_path):
    """`agentreach router --workers 2 --http-front granian`: both workers take calls on the shared port, and
    each answers its operator endpoints through the pass-through."""
    registry = await start_registry(auth=True, silence_timeout=60.0, health_interval=60.0)
    key = admin_key(registry)
    agent = await start_agent("echo-1")
    await workers.register_echo(registry.url, agent, (await issue_token(http, registry.url, key, "echo"))["token"])
    api_key = await workers.new_client(http, registry, key)
    port = free_port()
    router = await workers.Supervised.start(
        "router", "--workers", "2", "--http-front", "granian", "--port", str(port), "--registry", registry.url,
        "--data-dir", str(tmp_path / "router"), env={"AGENTREACH_ADMIN_KEY": key})
    try:
        pids = (await router.wait_logged("workers ready"))["pids"]
        url = f"http://127.0.0.1:{port}"
        caller = workers.Caller(url, api_key)
        await workers.until_forwarding(caller, pids, agent.port, router)
        assert caller.failures == []
        async with http.get(f"{url}/reach", headers={"X-API-Key": key}) as response:
            assert response.status == 200 and response.headers["Server"] == "granian"
        async with http.get(f"{url}/reach") as response:
            assert response.status == 401 and (await response.json())["error"] == "unauthenticated"
    finally:
        await router.close()


async def test_a_trickling_body_gets_a_408_and_a_trickling_header_is_cut_off(mesh):
    """GuardedSite's body and header deadlines on the Granian front (short ones, for the test)."""
    front = GranianFront(create_app(mesh.router), "127.0.0.1", 0, max_body=DEFAULT_MAX_BODY,
                         limits=Limits(body_timeout=0.3, header_timeout=0.5))
    port = await front.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /atp HTTP/1.1\r\nHost: router\r\nContent-Length: 100\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"error":"body_timeout"' in answer
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /atp HTTP/1.1\r\nHost: rou")
        await asyncio.wait_for(reader.read(), 5)  # closed by the server, well before the 5 s
        writer.close()
    finally:
        await front.stop()
