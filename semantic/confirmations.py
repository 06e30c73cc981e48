"""Confirmed intents travel from the router to the registry off the call path; needs no embed extra.

A caller that names a capability with ``confirm_intent`` says what its intent meant; the call is
routed as any named call, and the phrasing is queued here and reported to the registry, which keeps
it as a pending learned example (registry/examples.py). The queue is bounded: when the registry is
slow or away, confirmations are dropped (and logged), never calls delayed. One the registry did not
take for a passing reason (unreachable, overloaded, a 5xx) is tried again a bounded number of times,
so a registry restart or failover does not lose what callers taught meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import aiohttp
import msgspec
from agent_reach.headers import API_KEY_HEADER

from mesh.examples import Confirmation

if TYPE_CHECKING:
    from semantic.matcher import MatchRule

log = logging.getLogger("agentreach.router.confirmations")

# The caller counted when authentication is off: every confirmation then comes from one caller.
ANONYMOUS = "anonymous"
QUEUE_SIZE = 1000
# A confirmation that completes a capability's auto-acceptance waits for the registry's judgement, the
# first of which loads the model.
_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=2)
# Seconds before each further try of a confirmation the registry did not take: five more tries over
# about 15 s, long enough for a registry restart or a failover to the next registry, while the
# confirmations queued behind wait (and past QUEUE_SIZE are dropped) rather than calls.
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)

ReportConfirmation = Callable[[str, Confirmation], Awaitable[object]]


class ConfirmationRefused(Exception):
    """The registry answered, but not with a yes."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"registry answered {status}: {body[:200]!r}")
        self.status = status


def worth_retrying(exc: Exception) -> bool:
    """A refusal of what was sent (a 4xx other than 408 or 429, over HTTP or from the registry in process) fails
    the same way again; anything else may pass."""
    status = getattr(exc, "status", None)
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 429))


async def report_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                           capability: str, confirmation: Confirmation) -> None:
    headers = {"Content-Type": "application/json", **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.post(f"{registry_url}/examples/{capability}/confirmations",
                            data=msgspec.json.encode(confirmation), headers=headers, allow_redirects=False,
                            timeout=_TIMEOUT) as response:
        if response.status not in (200, 204):
            raise ConfirmationRefused(response.status, await response.read())


class ConfirmationQueue:
    """``rule``: the router's threshold and margin, reported with each confirmation (None: it matches no intents)."""

    def __init__(self, report: ReportConfirmation, rule: MatchRule | None = None, maxsize: int = QUEUE_SIZE,
                 retry_delays: Sequence[float] = RETRY_DELAYS):
        self._report = report
        self._rule = rule
        self._retry_delays = tuple(retry_delays)
        self._queue: asyncio.Queue[tuple[str, Confirmation]] = asyncio.Queue(maxsize)
        # What became of each confirmation: reported, queue_full, refused (a 4xx), given_up (tries exhausted).
        self.outcomes: Counter[str] = Counter()
        self.retries = 0

    def offer(self, capability: str, text: str, caller: str) -> None:
        rule = self._rule
        confirmation = Confirmation(text=text, caller=caller, threshold=rule.threshold if rule else None,
                                    margin=rule.margin if rule else None)
        try:
            self._queue.put_nowait((capability, confirmation))
        except asyncio.QueueFull:
            self.outcomes["queue_full"] += 1
            log.warning("confirmation dropped: the registry is behind", extra={"capability": capability})

    async def run(self) -> None:
        """Report each confirmation, trying again after a passing failure; the loop outlives any failure."""
        while True:
            capability, confirmation = await self._queue.get()
            self.outcomes[await self._deliver(capability, confirmation)] += 1

    async def _deliver(self, capability: str, confirmation: Confirmation) -> str:
        delays = iter(self._retry_delays)
        while True:
            try:
                await self._report(capability, confirmation)
                return "reported"
            except Exception as exc:  # the registry away, full, refusing: judged here, never raised
                failure = exc
            delay = next(delays, None) if worth_retrying(failure) else None
            if delay is None:
                outcome = "given_up" if worth_retrying(failure) else "refused"
                log.warning("confirmation not reported",
                            extra={"capability": capability, "outcome": outcome, "error": repr(failure)})
                return outcome
            self.retries += 1
            await asyncio.sleep(delay)
