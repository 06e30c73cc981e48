"""Serving an aiohttp app on a port and shutting it down: one way for every part of the mesh."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from agent_reach.admission import Gate, Limits
from agent_reach.connections import GuardedSite
from agent_reach.exhaustion import filter_exhaustion


async def listen(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 1.0,
                 limits: Limits | None = None, gate: Gate | None = None, reuse_port: bool = False,
                 **handler_args: Any) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns its runner and the port actually bound (``port=0`` picks a free one).
    Every connection is held to ``limits`` (deadlines, a connection cap), or to those of ``gate``, the
    listener's book of connections a server shows in its /metrics; ``reuse_port`` shares the port with
    other processes that ask for it too (SO_REUSEPORT); ``handler_args`` go to aiohttp's request handler
    (``max_line_size``, ``max_field_size``, ...)."""
    filter_exhaustion(asyncio.get_running_loop())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await GuardedSite(runner, host, port, gate or Gate(limits or Limits()), reuse_port=reuse_port, access_log=None,
                      **handler_args).start()
    return runner, runner.addresses[0][1]


async def cancel(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel background tasks and wait until they have finished unwinding."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def close(runner: web.AppRunner | None, session: aiohttp.ClientSession | None) -> None:
    """Stop serving first, then close the outgoing connection pool the handlers were using."""
    if runner is not None:
        await runner.cleanup()
    if session is not None:
        await session.close()
