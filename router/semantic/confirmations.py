"""Confirmed intents travel from the router to the registry off the call path; needs no embed extra.

A caller that names a capability with ``confirm_intent`` says what its intent meant; the call is
routed as any named call, and the phrasing is queued here and reported to the registry, which keeps
it as a pending learned example (registry/examples.py). The queue is bounded: when the registry is
slow or away, confirmations are dropped (and logged), never calls delayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from agent_reach.headers import API_KEY_HEADER

from mesh.examples import Confirmation

log = logging.getLogger("agentreach.router.confirmations")

# The caller counted when authentication is off: every confirmation then comes from one caller.
ANONYMOUS = "anonymous"
QUEUE_SIZE = 1000
# A confirmation that completes a capability's auto-acceptance waits for the registry's judgement, the
# first of which loads the model.
_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=2)

ReportConfirmation = Callable[[str, Confirmation], Awaitable[object]]


class ConfirmationRefused(Exception):
    """The registry answered, but not with a yes."""


async def report_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                           capability: str, confirmation: Confirmation) -> None:
    headers = {"Content-Type": "application/json", **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.post(f"{registry_url}/examples/{capability}/confirmations",
                            data=msgspec.json.encode(confirmation), headers=headers, allow_redirects=False,
                            timeout=_TIMEOUT) as response:
        if response.status not in (200, 204):
            raise ConfirmationRefused(f"registry answered {response.status}: {(await response.read())[:200]!r}")


class ConfirmationQueue:
    def __init__(self, report: ReportConfirmation, maxsize: int = QUEUE_SIZE):
        self._report = report
        self._queue: asyncio.Queue[tuple[str, Confirmation]] = asyncio.Queue(maxsize)
        self.dropped = 0

    def offer(self, capability: str, text: str, caller: str) -> None:
        try:
            self._queue.put_nowait((capability, Confirmation(text=text, caller=caller)))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("confirmation dropped: the registry is behind", extra={"capability": capability})

    async def run(self) -> None:
        """Report each confirmation once; one the registry does not take is logged and dropped."""
        while True:
            capability, confirmation = await self._queue.get()
            try:
                await self._report(capability, confirmation)
            except Exception as exc:  # the registry away, full, refusing: the loop must outlive any of it
                self.dropped += 1
                log.warning("confirmation not reported", extra={"capability": capability, "error": repr(exc)})
