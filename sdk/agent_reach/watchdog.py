"""Noticing a handler that blocks the event loop, before the registry notices missing heartbeats.

A task asks to wake every ``tick`` seconds; when it wakes much later, something held the loop
(sync I/O, CPU work) and heartbeats and every other call stalled with it. The warning names the
calls in progress, since one of them is the likely culprit.
"""

from __future__ import annotations

import asyncio
import logging
import time

from agent_reach.inflight import Inflight

log = logging.getLogger("agentreach.sdk")


async def watch_loop(inflight: Inflight, tick: float = 0.1, warn_after: float = 0.25) -> None:
    """Run forever; log a warning with the lag each time the loop wakes ``warn_after`` seconds late."""
    while True:
        expected = time.monotonic() + tick
        await asyncio.sleep(tick)
        lag = time.monotonic() - expected
        if lag >= warn_after:
            log.warning(
                "event loop blocked; heartbeats and calls stalled meanwhile (a handler doing sync work?)",
                extra={"lag_ms": round(lag * 1000), "inflight": [
                    {"request_id": request_id, "capability": capability}
                    for request_id, capability in inflight.calls.values()]},
            )
