"""Routers failing under load (issue 13, "Failures"): callers holding a ReachClient with two router URLs
lose no call the client could have sent elsewhere, and every other failure reaches them as a ReachError
with a code. Two real `agentreach router` processes follow one registry; the one in use gets kill -9,
or SIGSTOP (it still takes connections, it answers nothing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import aiohttp
import pytest
from agent_reach import ErrorCode, ReachClient, ReachError

from agent_support import Agent
from conftest import admin_key, wait_for
from failure_support import ChildProcess, Failed, routes, steady_load
from router_support import capability

RATE = 200  # calls a second
CALL_TIMEOUT = 5.0
# A call unanswered this long hangs: the client's own timeout has long fired.
HANG = CALL_TIMEOUT + 5.0


class TwoRouters(NamedTuple):
    first: ChildProcess
    second: ChildProcess
    # With auth on: the caller's client_id, client_secret and api_key.
    caller: dict[str, Any]


@pytest.fixture
def start_two_routers(start_registry, start_agent: Callable[..., Awaitable[Agent]],
                      router_process: Callable[..., Awaitable[ChildProcess]],
                      http: aiohttp.ClientSession) -> Callable[..., Awaitable[TwoRouters]]:
    """Two router processes following one registry, both routing `echo` to one agent that takes 50 ms
    a call (~10 calls in flight at any moment at RATE: a router that fails takes some down with it);
    ``auth=True``: callers authenticate, with a client made for them."""
    async def start(auth: bool = False) -> TwoRouters:
        registry = await start_registry(silence_timeout=60.0, health_interval=60.0, auth=auth)
        admin = {"X-API-Key": admin_key(registry)} if auth else {}
        echo = await start_agent("echo-1")
        echo.first_byte_delay = 0.05
        body = {"agent_id": echo.name, "service": "echo", "capabilities": [capability("echo", echo.endpoint)]}
        for path, sent in (("register", body), ("heartbeat", {"agent_id": echo.name})):
            async with http.post(f"{registry.url}/{path}", json=sent, headers=admin) as response:
                assert response.status == 200, await response.text()
        secrets: dict[str, Any] = {}
        if auth:
            new_client = {"name": "caller", "trust_level": "internal", "grants": ["echo"]}
            async with http.post(f"{registry.url}/clients", json=new_client, headers=admin) as response:
                assert response.status == 201, await response.text()
                secrets = await response.json()
        flags = ("--auth", "on", "--admin-key", admin["X-API-Key"]) if auth else ()
        first, second = await asyncio.gather(router_process(registry.url, *flags),
                                             router_process(registry.url, *flags))
        for router in (first, second):
            await routes(http, router.url, "echo", {"X-API-Key": secrets["api_key"]} if auth else None)
        return TwoRouters(first, second, secrets)

    return start


@pytest.fixture
async def two_routers(start_two_routers: Callable[..., Awaitable[TwoRouters]]) -> TwoRouters:
    return await start_two_routers()


def caller(client: ReachClient, timeout: float) -> Callable[[int], Awaitable[str]]:
    async def call(n: int) -> str:
        """Which router answered; or the code the caller was given, followed by the router the client
        failed to hear from when it was the client that gave up (a router's own answers name none)."""
        try:
            await client.call("echo", {"n": n}, timeout=timeout)
        except ReachError as exc:
            named = [url for url in client.routers.urls if f"{url}/" in str(exc)]
            raise Failed(" ".join([exc.error_code, *named]), str(exc)) from exc
        return client.router_url
    return call


async def test_a_router_killed_under_load_loses_no_call_the_client_could_retry(two_routers):
    first, second, _ = two_routers
    async with ReachClient([first.url, second.url]) as client, \
            steady_load(caller(client, CALL_TIMEOUT), rate=RATE, concurrency=32, deadline=HANG) as tally:
        await wait_for(lambda: tally.counts()[first.url] >= RATE, what="a second of calls via the first")
        assert client.router_url == first.url
        first.kill()
        killed, killed_at = len(tally.outcomes), time.monotonic()
        await wait_for(lambda: tally.counts()[second.url] >= RATE, timeout=20,
                       what=f"a second of calls via the second router ({tally})")
    failed = {label: count for label, count in tally.counts().items() if label not in (first.url, second.url)}
    summary = f"{len(tally.outcomes)} calls, router killed after {killed}: {tally}"
    # CONNECT_TIMEOUT is the client's "no router could be connected to": a call it could have sent to the
    # live one. Nothing may hang or escape as anything but a ReachError carrying one of the mesh's codes.
    assert ErrorCode.CONNECT_TIMEOUT not in failed, summary
    # A call started once the router was dead never reached it: it must have gone to the live one.
    assert set(tally.counts(started_after=killed_at)) == {second.url}, summary
    assert {label.split()[0] for label in failed} <= set(ErrorCode), summary
    # A failure is a call the dead router had taken: at most what the client had in flight to it.
    assert sum(failed.values()) <= 32, summary
    print(summary)


async def test_a_frozen_router_is_passed_over_once_it_let_a_call_time_out(two_routers):
    """A SIGSTOPped router still completes TCP handshakes (the kernel does), so connecting cannot tell it
    from a live one; the calls sent to it run out their time and are reported (they were sent: never sent
    again). Once one has, the calls that follow go to the other router, not into the same silence."""
    first, second, _ = two_routers
    timeout = 3.0
    async with ReachClient([first.url, second.url]) as client, \
            steady_load(caller(client, timeout), rate=RATE, concurrency=64, deadline=timeout + 5) as tally:
        await wait_for(lambda: tally.counts()[first.url] >= RATE, what="a second of calls via the first")
        first.pause()
        try:
            unheard = f"{ErrorCode.TOTAL_TIMEOUT} {first.url}"
            silent = await wait_for(lambda: min((o.ended for o in tally.outcomes if o.label == unheard),
                                                default=None), timeout=15, what="a call to time out")
            await wait_for(lambda: tally.counts(started_after=silent)[second.url] >= RATE, timeout=20,
                           what=f"a second of calls via the second router ({tally})")
        finally:
            first.resume()
    summary = f"{len(tally.outcomes)} calls: {tally}"
    # None sent into the silence once the client had heard it. (On a loaded machine the live router may be
    # slow too: what the client says of it is reported with a code, and counted here.)
    assert tally.counts(started_after=silent)[unheard] == 0, summary
    assert {label.split()[0] for label in tally.counts()} <= {first.url, second.url, *ErrorCode}, summary
    print(summary)


async def test_a_call_on_a_kept_alive_connection_the_dead_router_closed_goes_to_the_live_one(two_routers):
    """The client keeps connections to the router it uses. Killed, the router's kernel closes them, and a
    call that takes one from the pool before its loop has read that close finds it closing when it comes
    to write the request: nothing was sent, so the call goes to the next router as a refused connect would
    (it was answered AGENT_ERROR). The call runs as a task started after the kill, as under load, so the
    loop reads the close between taking the connection and writing on it."""
    first, second, _ = two_routers
    async with ReachClient([first.url, second.url]) as client:
        await client.call("echo", "kept alive", timeout=CALL_TIMEOUT)
        assert client.router_url == first.url
        first.kill()
        assert await asyncio.create_task(client.call("echo", "after", timeout=CALL_TIMEOUT)) == {
            "echo": "after", "agent": "echo-1"}
        assert client.router_url == second.url


async def test_a_frozen_router_s_token_endpoint_is_passed_over(start_two_routers):
    """A caller with OAuth2 client credentials first fetches a token from the router it is about to call.
    A fetch that gets no answer (a frozen router) sent no call, and a token may be asked for again: the
    call goes to the next router (it was answered UNAUTHENTICATED, as if the credentials were wrong)."""
    first, second, secrets = await start_two_routers(auth=True)
    first.pause()
    async with ReachClient([first.url, second.url], client_id=secrets["client_id"],
                           client_secret=secrets["client_secret"]) as client:
        assert await client.call("echo", "token", timeout=1.0) == {"echo": "token", "agent": "echo-1"}
        assert client.router_url == second.url
