"""Every routed call's trace handed to the OTLP exporter process (router/otel_exporter.py), off the call path.

The call path pays a small record and a list append per call (``export``); a batch leaves when it holds
``BATCH`` calls or every ``FLUSH_SECONDS``, as one msgpack frame written to the exporter's stdin without
waiting. Export is best effort, as the SDK's own batch processor is: while the exporter is behind by more than
``MAX_UNSENT_BYTES`` of frames, or gone, batches are dropped and counted (``dropped``), and a dead exporter
is started again at the next flush (at most once every ``RESTART_SECONDS``). A call whose caller did not
sample its trace (``traceparent`` flags 00) is not sent at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import sys
import time

import msgspec
from agent_reach.usage import Usage

from router.tracecontext import CallSpan
from router.traces import AttemptTrace

log = logging.getLogger("agentreach.router.otel")

FRAME = struct.Struct(">I")
BATCH = 256
FLUSH_SECONDS = 0.2
MAX_UNSENT_BYTES = 8 * 1024 * 1024
STOP_SECONDS = 10.0  # for the exporter to send what it holds when the router stops
# A new exporter at most this often: one that dies as it starts (a broken install) is not respawned at every flush.
RESTART_SECONDS = 5.0


class ExportedCall(msgspec.Struct, array_like=True, gc=False):
    """What the exporter needs of one ended call, and no more: its spans' facts and ids. A list, not a map, on
    the pipe: half the bytes of a CallTrace, decoded in half the time, and no CallTrace built for a call the
    trace store does not keep."""

    request_id: str
    capability: str
    started_at: float  # wall clock seconds
    total_ms: float
    outcome: str
    error_code: str | None  # an ErrorCode, or CANCELLED
    caller: str | None
    policy: str | None
    degraded: bool
    reason: str | None
    usage: Usage | None
    attempts: list[AttemptTrace]
    trace_id: str
    span_id: str  # the router's span of the call
    parent_span_id: str | None  # the caller's span, from its traceparent


def caller_sampled(span: CallSpan) -> bool:
    """False only for a call in a caller's trace that the caller marked unsampled."""
    return span.parent_span_id is None or span.flags[-1] in "13579bdf"


class CallExport:
    def __init__(self, service: str, endpoint: str | None):
        self.service = service
        self.endpoint = endpoint
        self.dropped = 0  # calls whose spans were not handed to the exporter
        self._pending: list[ExportedCall] = []
        self._process: asyncio.subprocess.Process | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._next_start = 0.0  # monotonic: when a dead exporter may be replaced
        self._encoder = msgspec.msgpack.Encoder()

    @property
    def exporter_pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def start(self) -> None:
        await self._start_exporter()
        self._flusher = asyncio.create_task(self._flush_forever())

    async def _start_exporter(self) -> None:
        args = [self.service, *([self.endpoint] if self.endpoint else [])]
        self._process = await asyncio.create_subprocess_exec(sys.executable, "-m", "router.otel_exporter", *args,
                                                             stdin=asyncio.subprocess.PIPE)

    def export(self, call: ExportedCall) -> None:
        """A call its caller sampled (``caller_sampled``), handed over with the next batch."""
        self._pending.append(call)
        if len(self._pending) >= BATCH:
            self._hand_off()

    def _hand_off(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        process = self._process
        stdin = process.stdin if process is not None and process.returncode is None else None
        if stdin is None or stdin.is_closing() or stdin.transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            self.dropped += len(batch)
            return
        body = self._encoder.encode(batch)
        stdin.write(FRAME.pack(len(body)) + body)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            now = time.monotonic()
            if self._process is not None and self._process.returncode is not None and now >= self._next_start:
                log.warning("the OTLP exporter process exited; starting another",
                            extra={"returncode": self._process.returncode, "dropped": self.dropped})
                self._next_start = now + RESTART_SECONDS
                await self._start_exporter()
            self._hand_off()

    async def stop(self) -> None:
        """Hand off what is pending, close the exporter's stdin and let it send what it holds."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        self._hand_off()
        process = self._process
        if process is None or process.stdin is None:
            return
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
