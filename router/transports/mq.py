"""Message-queue agents (``protocol: "mq"``, agent_reach.mq_wire): a call is appended to the capability's request
stream on the router's broker (``--broker``), taken by one instance of the capability's consumer group, and
answered on this router's own reply stream, which one reader task reads and hands out by call id.

Each attempt at a call is an entry of its own, with an id of its own (the envelope's; the call's request_id
travels in X-Request-Id): a retry on the same stream is never taken for the attempt given up before it.

The timeouts: connect bounds reaching the broker and appending the call (a broker that cannot be reached:
unsent, failing over is safe; an append the broker did not confirm in time may be on it, so it counts as sent and
is retried only when idempotent), first byte the first entry answering it, idle the gap between chunks, total the
whole call; the deadline travels in the call (an instance drops it unread once past). An attempt given up (a
timeout, the caller gone) is cancelled on the stream (agent_reach.broker.Broker.cancel). An instance that dies
holding a call has it claimed by a sibling after its visibility timeout: the call is answered once, by the first
instance to answer it; what any other instance sends for it (a slow instance whose call was claimed meanwhile) is
dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter, OrderedDict
from typing import Any

from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.broker import Broker, BrokerDown
from agent_reach.headers import (
    COMPLETION_URL_HEADER,
    CONSUMER_HEADER,
    DEAD_LETTERED_HEADER,
    DEADLINE_HEADER,
    DELIVERIES_HEADER,
    REPLY_TO_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from agent_reach.mq_wire import METHOD, broker_origin, parse_endpoint
from agent_reach.redis_broker import RedisBroker
from agent_reach.signing import sign
from agent_reach.socket_wire import CALL, CHUNK, REPLY, Envelope, WireError, decode, encode
from yarl import URL

from mesh.egress import Egress, host_verdict
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer
from router.transports.atp import AtpDialect
from router.transports.exchange import Exchange, Received

log = logging.getLogger("agentreach.router.mq")

# How long one read of the reply stream waits before it reads again (an idle router costs a read a second).
_READ_BLOCK_S = 1.0
_READ_COUNT = 512
# After the broker failed, how long before reading again (doubling up to the last).
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
# A reply stream whose router is gone is deleted by the broker this long after the last answer it got.
_REPLY_STREAM_KEEP_S = 3600.0
# Calls answered lately, remembered so an answer sent again for one is told from an answer for no call at all.
_ANSWERED_KEPT = 10_000


class _Waiting:
    """One call in flight: its messages, and the instance answering it (the first whose entry came)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Received] = asyncio.Queue()
        self.consumer: str | None = None


class MqTransport:
    def __init__(self, broker_url: str | None, egress: Egress):
        self.broker_url = broker_url
        self._egress = egress
        self._broker: Broker | None = None
        self._refusal: str | None = None
        self.reply_stream = f"agentreach.replies.{uuid.uuid4().hex}"
        self._calls: dict[str, _Waiting] = {}
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._reader: asyncio.Task[None] | None = None
        self._cancels: set[asyncio.Task[None]] = set()
        self._dialect = AtpDialect()
        # Where an agent may report a call's completion (X-Reach-Completion-Url); set once the router listens.
        self.completion_url: str | None = None
        # duplicates: answers for a call another instance answered; redelivered: calls answered after an
        # instance died holding them; dead_lettered: calls agents gave up as poison (/metrics).
        self.counts: Counter[str] = Counter()

    async def close(self) -> None:
        tasks = [task for task in (self._reader, *self._cancels) if task is not None]
        if self._reader is not None:
            self._reader.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._broker is not None:
            await self._broker.close()

    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        started = time.monotonic()
        answer = await self._send(endpoint, frame, timeouts, signing_key, span, relay,
                                  Exchange(timeouts, max_answer_bytes))
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        return answer

    async def _send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                    span: CallSpan, relay: Relay, exchange: Exchange) -> AgentAnswer:
        stream = parse_endpoint(endpoint).stream  # the registry checked it
        try:
            async with asyncio.timeout(timeouts.connect_s):
                broker = await self._reach(endpoint)
        except TimeoutError:
            return _unsent(ErrorCode.CONNECT_TIMEOUT, f"the broker was not reached within "
                                                      f"{timeouts.connect_s * 1000:.0f} ms")
        if isinstance(broker, str):
            return _unsent(ErrorCode.AGENT_ERROR, broker)
        body, _ = self._dialect.request(frame, int(timeouts.total_s * 1000))
        call_id = uuid.uuid4().hex
        waiting = self._calls[call_id] = _Waiting()
        try:
            try:
                async with asyncio.timeout(timeouts.connect_s):
                    await broker.publish(stream, self._message(stream, call_id, frame.request_id, body, timeouts,
                                                               signing_key, span))
            except TimeoutError:
                self._cancel(broker, stream, call_id, timeouts)  # in case it did arrive: dropped unread
                return AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT,
                                   message=f"the broker did not confirm the call within {timeouts.connect_s * 1000:.0f}"
                                           " ms (it may be on the broker: cancelled, and dropped past its deadline)")
            except BrokerDown as exc:
                return _unsent(ErrorCode.AGENT_ERROR, str(exc))
            except asyncio.CancelledError:  # the caller left while the call was being appended
                self._cancel(broker, stream, call_id, timeouts)
                raise
            try:
                return await exchange.answer(waiting.queue, relay, self._dialect)
            finally:
                if not exchange.ended:  # the router gave up (a timeout, the caller gone, the cap)
                    self._cancel(broker, stream, call_id, timeouts)
        finally:
            del self._calls[call_id]
            self._answered[call_id] = None
            if len(self._answered) > _ANSWERED_KEPT:
                self._answered.popitem(last=False)

    def _message(self, stream: str, call_id: str, request_id: str, body: bytes, timeouts: ResolvedTimeouts,
                 signing_key: str | None, span: CallSpan) -> bytes:
        headers = {REQUEST_ID_HEADER: request_id, TRACEPARENT_HEADER: span.traceparent,
                   REPLY_TO_HEADER: self.reply_stream,
                   DEADLINE_HEADER: str(int((time.time() + timeouts.total_s) * 1000))}
        if span.tracestate is not None:
            headers[TRACESTATE_HEADER] = span.tracestate
        if signing_key is not None:  # for the stream (whichever instance takes it) and this reply stream
            headers[SIGNATURE_HEADER] = sign(signing_key, stream, METHOD, self.reply_stream, request_id, body)
        if self.completion_url:
            headers[COMPLETION_URL_HEADER] = self.completion_url
        return encode(Envelope(type=CALL, id=call_id, headers=headers), body)

    async def _reach(self, endpoint: str) -> Broker | str:
        """The broker, its reply stream read, when ``endpoint`` is on it; else why the call cannot be sent."""
        if self.broker_url is None:
            return "this router has no broker for mq agents (agentreach router --broker redis://host:port)"
        if parse_endpoint(endpoint).broker != broker_origin(self.broker_url):
            return f"this router reaches mq agents on {broker_origin(self.broker_url)} only (--broker)"
        if self._broker is None and self._refusal is None:
            url = URL(self.broker_url)
            verdict = await host_verdict(self._egress, url.raw_host or "", url.port or 6379)
            if verdict is not None:
                self._refusal = f"the egress rule refuses the broker: {verdict[1]}"
                log.error("mq_broker_refused", extra={"broker": broker_origin(self.broker_url),
                                                      "why": self._refusal})
            else:
                self._broker = RedisBroker(self.broker_url)
                self._reader = asyncio.get_running_loop().create_task(self._read(self._broker))
        return self._broker if self._broker is not None else str(self._refusal)

    def _cancel(self, broker: Broker, stream: str, call_id: str, timeouts: ResolvedTimeouts) -> None:
        """Tell the stream's instances to stop the attempt; a task of its own, so a cancelled call still sends it."""
        task = asyncio.get_running_loop().create_task(self._tell_cancel(broker, stream, call_id, timeouts))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    @staticmethod
    async def _tell_cancel(broker: Broker, stream: str, call_id: str, timeouts: ResolvedTimeouts) -> None:
        with contextlib.suppress(BrokerDown, TimeoutError):
            async with asyncio.timeout(max(timeouts.connect_s, 0.5)):
                await broker.cancel(stream, call_id, timeouts.total_s)

    async def _read(self, broker: Broker) -> None:
        """Hand each entry of the reply stream to its call; a broker that fails is read again after a back-off
        (the answers wait in the stream meanwhile; the calls have their deadlines)."""
        after, failures = "0-0", 0
        while True:
            try:
                entries = await broker.read(self.reply_stream, after, _READ_BLOCK_S, _READ_COUNT)
                if entries:
                    after = entries[-1].id
                    await broker.forget(self.reply_stream, after, _REPLY_STREAM_KEEP_S)
            except BrokerDown as exc:
                log.warning("mq_broker_unreachable", extra={"stream": self.reply_stream, "error": str(exc)})
                await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
                failures += 1
                continue
            failures = 0
            for entry in entries:
                self._deliver(entry.message)

    def _deliver(self, message: bytes) -> None:
        try:
            envelope, body = decode(message)
        except WireError as exc:
            log.warning("mq_reply_refused", extra={"why": str(exc)})
            return
        consumer = envelope.headers.get(CONSUMER_HEADER, "")
        waiting = self._calls.get(envelope.id) if envelope.type in (CHUNK, REPLY) else None
        if waiting is not None and waiting.consumer in (None, consumer):
            waiting.consumer = consumer
            if envelope.type == REPLY:
                self._count_reply(envelope.headers)
            waiting.queue.put_nowait((envelope, body))
        elif envelope.id in self._answered or waiting is not None:
            self.counts["duplicates"] += 1
            log.info("mq_duplicate_dropped", extra={"call_id": envelope.id, "consumer": consumer,
                                                    "type": envelope.type})
        else:
            log.warning("mq_reply_refused", extra={"call_id": envelope.id, "why": f"a {envelope.type!r} "
                                                   "entry for no call this router sent"})

    def _count_reply(self, headers: dict[str, Any]) -> None:
        if headers.get(DEAD_LETTERED_HEADER):
            self.counts["dead_lettered"] += 1
        elif headers.get(DELIVERIES_HEADER, "1") != "1":
            self.counts["redelivered"] += 1


def _unsent(code: ErrorCode, message: str) -> AgentAnswer:
    return AgentAnswer(error_code=code, sent=False, message=message)
