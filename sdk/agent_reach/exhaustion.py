"""Running out of file descriptors, socket buffers or memory is this process's own trouble, not a
peer's: told apart from other errors, and reported once per interval instead of once per event
(under an fd flood, asyncio's accept loop alone reports EMFILE every second on every listener,
each with a traceback)."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentreach.exhaustion")

EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
REPORT_INTERVAL = 10.0


def local_exhaustion(exc: BaseException | None) -> OSError | None:
    """The OSError saying this process ran out of a resource, found in ``exc`` or what caused it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in EXHAUSTION_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class Throttle:
    """Counts events; the first, and then at most one per ``interval``, is let through to be
    reported along with how many happened since the last report."""

    def __init__(self, interval: float = REPORT_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._clock = clock
        self._next_report = float("-inf")
        self._pending = 0

    def event(self, events: int = 1) -> int:
        """0 when these events are to stay quiet; else the number to report (these included)."""
        self._pending += events
        now = self._clock()
        if now < self._next_report:
            return 0
        self._next_report = now + self.interval
        count, self._pending = self._pending, 0
        return count

    def log(self, logger: logging.Logger, level: int, message: str, events: int = 1, **fields: Any) -> None:
        """Log ``message`` if these events are due a report, with how many there were (``events``)."""
        count = self.event(events)
        if count:
            logger.log(level, message, extra={**fields, "events": count, "interval_seconds": self.interval})


class ExhaustionFilter:
    """A loop exception handler: exhaustion becomes one log line per interval; anything else goes
    to the handler that was there before."""

    def __init__(self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None):
        self._previous = previous
        self.throttle = Throttle()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exhausted = local_exhaustion(context.get("exception"))
        if exhausted is None:
            if self._previous is None:
                loop.default_exception_handler(context)
            else:
                self._previous(loop, context)
            return
        self.throttle.log(log, logging.ERROR, "out of a system resource; new connections wait until some close",
                          errno=errno.errorcode.get(exhausted.errno or 0, exhausted.errno),
                          what=context.get("message"))


def filter_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """Install the filter on ``loop`` once, keeping whatever handler it had."""
    current = loop.get_exception_handler()
    if not isinstance(current, ExhaustionFilter):
        loop.set_exception_handler(ExhaustionFilter(current))
