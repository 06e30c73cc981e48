"""A router killed under load (issue 13, "Failures"): callers holding a ReachClient with two router URLs
lose no call the client could have sent elsewhere, and every other failure reaches them as a ReachError
with a code. Two real `agentreach router` processes follow one registry; the one in use gets kill -9."""

from __future__ import annotations

import time

from agent_reach import ErrorCode, ReachClient, ReachError

from conftest import wait_for
from failure_support import Failed, routes, steady_load
from router_support import capability

RATE = 200  # calls a second
CALL_TIMEOUT = 5.0
# A call unanswered this long hangs: the client's own timeout has long fired.
HANG = CALL_TIMEOUT + 5.0


async def test_a_router_killed_under_load_loses_no_call_the_client_could_retry(
        start_registry, start_agent, router_process, http):
    registry = await start_registry(silence_timeout=60.0, health_interval=60.0)
    echo = await start_agent("echo-1")
    echo.first_byte_delay = 0.05  # ~10 calls in flight at any moment: the killed router takes some down with it
    body = {"agent_id": echo.name, "service": "echo", "capabilities": [capability("echo", echo.endpoint)]}
    async with http.post(f"{registry.url}/register", json=body) as response:
        assert response.status == 200, await response.text()
    async with http.post(f"{registry.url}/heartbeat", json={"agent_id": echo.name}) as response:
        assert response.status == 200, await response.text()
    routers = [await router_process(registry.url), await router_process(registry.url)]
    for router in routers:
        await routes(http, router.url, "echo")

    async with ReachClient([router.url for router in routers]) as client:
        async def call(n: int) -> str:
            """Which router answered, or the code the caller was given."""
            try:
                await client.call("echo", {"n": n}, timeout=CALL_TIMEOUT)
            except ReachError as exc:
                raise Failed(exc.error_code, str(exc)) from exc
            return client.router_url

        async with steady_load(call, rate=RATE, concurrency=32, deadline=HANG) as tally:
            await wait_for(lambda: tally.counts()[routers[0].url] >= RATE, what="a second of calls via the first")
            assert client.router_url == routers[0].url
            routers[0].kill()
            killed, killed_at = len(tally.outcomes), time.monotonic()
            await wait_for(lambda: tally.counts()[routers[1].url] >= 2 * RATE, timeout=20,
                           what=f"two seconds of calls via the second router ({tally})")
    counts = tally.counts()
    failed = {label: count for label, count in counts.items() if label not in (routers[0].url, routers[1].url)}
    summary = f"{len(tally.outcomes)} calls, router killed after {killed}: {tally}"
    # CONNECT_TIMEOUT is the client's "no router could be connected to": a call it could have sent to the
    # live one. Nothing may hang or escape as anything but a ReachError carrying one of the mesh's codes.
    assert ErrorCode.CONNECT_TIMEOUT not in failed, summary
    # A call started once the router was dead never reached it: it must have gone to the live one.
    assert set(tally.counts(started_after=killed_at)) == {routers[1].url}, summary
    assert set(failed) <= set(ErrorCode), summary
    # A failure is a call the dead router had taken: at most what the client had in flight to it.
    assert sum(failed.values()) <= 32, summary
    print(summary)
