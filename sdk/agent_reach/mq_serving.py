"""An agent's end of ATP over a message broker (agent_reach.mq_wire): each mq capability's request stream read
in the capability's consumer group, every call served by the same Dispatcher as an HTTP call (deadline,
in-flight count, drain, business errors, streaming), so the protocol changes nothing for the handler.

An entry is refused (logged, dead-lettered, never answered: its reply stream cannot be trusted) when it is no
call, names no reply stream or deadline, or, on an agent holding a registration token, is unsigned, signed for
another stream or reply stream, or a replay (a nonce another entry used: the stream's instances share their
nonces in the broker). A call past its deadline, or cancelled before it was taken, is dropped unread. A call
delivered more than ``max_deliveries`` times (each instance taking it died) is dead-lettered and answered
AGENT_ERROR. A call runs with what is left of its deadline (its ``timeout_hint`` cut to it: the time it waited
in the stream is spent). The entries an instance runs are held (their idle time reset) every third of the
visibility timeout; an entry idle longer (its instance died) is claimed by a sibling. A cancel on the stream's
cancel channel names the call's id (one attempt: the envelope's id, not its request_id) and cancels its task: the
handler sees CancelledError at its next await.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from agent_reach import peer_json
from agent_reach.atp import ErrorCode, RequestFrame
from agent_reach.broker import Broker, BrokerDown, Entry
from agent_reach.dispatch import Dispatcher, Native, Reply, error_reply
from agent_reach.guard import CallGuard
from agent_reach.headers import (
    CONSUMER_HEADER,
    DEAD_LETTERED_HEADER,
    DEADLINE_HEADER,
    DELIVERIES_HEADER,
    REPLY_TO_HEADER,
    REQUEST_ID_HEADER,
)
from agent_reach.inflight import Inflight
from agent_reach.mq_wire import GROUP, METHOD, STREAM, nonce_key, parse_endpoint
from agent_reach.socket_wire import CALL, CHUNK, REPLY, Envelope, WireError, decode, encode
from agent_reach.sse import Chunk

log = logging.getLogger("agentreach.sdk")

# An entry its instance has not touched for this long is claimed by a sibling (the instance died holding it).
VISIBILITY_S = 10.0
# A call delivered more often than this (every instance taking it died) is dead-lettered.
MAX_DELIVERIES = 3
# How long one read waits for an entry before the loop looks at its stop and free slots again.
_READ_BLOCK_S = 1.0
# After the broker failed, how long before trying again (doubling up to the last).
_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)

_encoder = msgspec.json.Encoder()
_frames = peer_json.Decoder(RequestFrame)


class MqChunks:
    """One call's chunks as ``chunk`` entries on the router's reply stream."""

    def __init__(self, broker: Broker, reply_to: str, call_id: str, headers: dict[str, str]):
        self.broker = broker
        self.reply_to = reply_to
        self.call_id = call_id
        self.headers = headers

    @contextlib.contextmanager
    def watch(self, caller_gone: Callable[[], Any]) -> Iterator[bool]:
        """Nothing to hook: a cancel from the router cancels the call's own task."""
        yield True

    async def chunk(self, request_id: str, seq: int, data: msgspec.Raw) -> None:
        await self.broker.publish(self.reply_to, encode(Envelope(type=CHUNK, id=self.call_id, headers=self.headers),
                                                        _encoder.encode(Chunk(request_id=request_id, seq=seq,
                                                                              data=data))))


class _Refused(Exception):
    """An entry that is no call this agent may serve: dead-lettered, never answered."""


class MqServer:
    """The agent's consumers: one reader and one sweeper per mq capability, one cancel listener for them all."""

    def __init__(self, dispatcher: Dispatcher, guard: CallGuard, inflight: Inflight, broker: Broker, consumer: str,
                 visibility_s: float = VISIBILITY_S, max_deliveries: int = MAX_DELIVERIES):
        self.dispatcher = dispatcher
        self.guard = guard
        self.inflight = inflight
        self.broker = broker
        self.consumer = consumer
        self.visibility_s = visibility_s
        self.max_deliveries = max_deliveries
        # Entries being served, by entry id (stream, call id, task); call ids the router cancelled.
        self.running: dict[str, tuple[str, str, asyncio.Task[None]]] = {}
        self.told_to_cancel: set[str] = set()
        # What became of entries besides plain answers, for the heartbeat's metrics (mq_<what>).
        self.counts: Counter[str] = Counter()
        self._loops: list[asyncio.Task[None]] = []
        self._room = asyncio.Event()

    @property
    def free(self) -> int:
        return self.inflight.limit - len(self.running)

    async def start(self, natives: Iterable[Native]) -> None:
        served = {parse_endpoint(native.capability.endpoint).stream: native for native in natives}
        for stream in served:
            await self.broker.join(stream, GROUP)
        loop = asyncio.get_running_loop()
        for stream, native in served.items():
            self._loops += [loop.create_task(self._take(stream, native)),
                            loop.create_task(self._sweep(stream, native))]
        self._loops.append(loop.create_task(self._listen(list(served))))
        log.info("mq consumer started", extra={"consumer": self.consumer, "streams": sorted(served)})

    async def close(self) -> None:
        """Stop reading; calls still running are cancelled unanswered and unacked: a sibling claims them."""
        tasks = self._loops + [task for _, _, task in self.running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.broker.close()

    async def _take(self, stream: str, native: Native) -> None:
        failures = 0
        while not self.inflight.draining:
            if self.free <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                entries = await self.broker.take(stream, GROUP, self.consumer, self.free, _READ_BLOCK_S)
            except BrokerDown as exc:
                failures = await _backed_off(failures, stream, exc)
                continue
            failures = 0
            for entry in entries:
                self._start(stream, native, entry)

    async def _sweep(self, stream: str, native: Native) -> None:
        """Hold what this instance runs; claim what a dead sibling held."""
        while True:
            await asyncio.sleep(self.visibility_s / 3)  # a period, not a wait for anything
            held = [entry_id for entry_id, (at, _, _) in self.running.items() if at == stream]
            try:
                await self.broker.hold(stream, GROUP, self.consumer, held)
                if self.inflight.draining or self.free <= 0:
                    continue
                claimed = await self.broker.claim(stream, GROUP, self.consumer, self.visibility_s, self.free)
            except BrokerDown as exc:
                log.warning("mq_broker_unreachable", extra={"stream": stream, "error": str(exc)})
                continue
            for entry in claimed:
                if entry.id not in self.running:
                    self.counts["redeliveries"] += 1
                    log.warning("mq_call_redelivered", extra={"capability": native.capability.name,
                                                              "entry": entry.id, "deliveries": entry.deliveries})
                    self._start(stream, native, entry)

    async def _listen(self, streams: list[str]) -> None:
        failures = 0
        while True:
            try:
                async for call_id in self.broker.cancels(streams):
                    failures = 0
                    for _, running_id, task in self.running.values():
                        if running_id == call_id:
                            self.told_to_cancel.add(call_id)
                            task.cancel()
            except BrokerDown as exc:
                failures = await _backed_off(failures, "cancel channels", exc)

    def _start(self, stream: str, native: Native, entry: Entry) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(stream, native, entry))
        self.running[entry.id] = (stream, "", task)
        task.add_done_callback(lambda _: self._finished(entry.id))

    def _finished(self, entry_id: str) -> None:
        self.running.pop(entry_id, None)
        self._room.set()

    async def _serve(self, stream: str, native: Native, entry: Entry) -> None:
        name = native.capability.name
        try:
            await self._answer(stream, native, entry)
        except _Refused as refused:
            self.counts["refused"] += 1
            log.warning("mq_message_refused", extra={"capability": name, "entry": entry.id,
                                                     "call_id": refused.args[1], "why": refused.args[0]})
            with contextlib.suppress(BrokerDown):
                await self.broker.dead_letter(stream, GROUP, entry, refused.args[0])
        except BrokerDown as exc:  # unacked: it is delivered again once its visibility timeout passes
            log.warning("mq_broker_unreachable", extra={"capability": name, "entry": entry.id, "error": str(exc)})

    async def _answer(self, stream: str, native: Native, entry: Entry) -> None:
        envelope, body = self._checked(stream, entry)
        call_id, headers = envelope.id, envelope.headers
        request_id, reply_to = headers.get(REQUEST_ID_HEADER, ""), headers[REPLY_TO_HEADER]
        self.running[entry.id] = (stream, call_id, self.running[entry.id][2])
        if self.guard.active:
            signed = self.guard.signed_for(stream, METHOD, reply_to, headers, body)
            if isinstance(signed, str):
                raise _Refused(signed, call_id)
            if not await self.broker.first_use(nonce_key(stream, signed.nonce), entry.id, 2 * self.guard.window_s):
                raise _Refused("replayed: another entry carried this signature", call_id)
        answer_headers = {CONSUMER_HEADER: self.consumer, DELIVERIES_HEADER: str(entry.deliveries)}
        left_ms = int(headers[DEADLINE_HEADER]) - int(time.time() * 1000)
        if left_ms <= 0:
            await self._drop(stream, entry, "mq_call_expired", "expired", call_id)
            return
        if entry.deliveries > self.max_deliveries:
            why = f"dead-lettered after {entry.deliveries - 1} deliveries (each instance taking it died)"
            self.counts["dead_lettered"] += 1
            log.error("mq_call_dead_lettered", extra={"capability": native.capability.name, "request_id": request_id,
                                                      "deliveries": entry.deliveries - 1})
            await self.broker.dead_letter(stream, GROUP, entry, why)
            reply = error_reply(request_id, ErrorCode.AGENT_ERROR, why)
            await self._reply(reply_to, call_id, reply, {**answer_headers, DEAD_LETTERED_HEADER: "1"})
            return
        if await self.broker.cancelled(stream, call_id):
            await self._drop(stream, entry, "mq_call_cancelled_unread", "cancelled", call_id)
            return
        try:
            reply = await self.dispatcher.handle(native, native.capability.name, _within(body, left_ms), headers,
                                                 caller_gone=lambda: call_id in self.told_to_cancel,
                                                 out=MqChunks(self.broker, reply_to, call_id, answer_headers),
                                                 verified=True)
        except asyncio.CancelledError:
            if call_id not in self.told_to_cancel:
                raise  # the agent is stopping: unacked, a sibling claims it
            await self._drop(stream, entry, "mq_call_cancelled", "cancelled", call_id)
            return
        finally:
            self.told_to_cancel.discard(call_id)
        await self._reply(reply_to, call_id, reply, answer_headers)
        await self.broker.done(stream, GROUP, entry.id)

    def _checked(self, stream: str, entry: Entry) -> tuple[Envelope, bytes]:
        """The call an entry carries, if it is one: an envelope naming a reply stream and a deadline."""
        try:
            envelope, body = decode(entry.message)
        except WireError as exc:
            raise _Refused(str(exc), "") from None
        headers = envelope.headers
        if envelope.type != CALL:
            raise _Refused(f"a router does not send {envelope.type!r}", envelope.id)
        if not STREAM.fullmatch(headers.get(REPLY_TO_HEADER, "")):
            raise _Refused(f"no valid {REPLY_TO_HEADER}", envelope.id)
        if not headers.get(DEADLINE_HEADER, "").isascii() or not headers.get(DEADLINE_HEADER, "").isdigit():
            raise _Refused(f"no valid {DEADLINE_HEADER}", envelope.id)
        return envelope, body

    async def _drop(self, stream: str, entry: Entry, event: str, counted: str, call_id: str) -> None:
        self.counts[counted] += 1
        log.info(event, extra={"stream": stream, "entry": entry.id, "call_id": call_id})
        await self.broker.done(stream, GROUP, entry.id)

    async def _reply(self, reply_to: str, call_id: str, reply: Reply, headers: dict[str, str]) -> None:
        await self.broker.publish(reply_to, encode(Envelope(type=REPLY, id=call_id, status=reply.status,
                                                            headers=headers), reply.body))


def _within(body: bytes, left_ms: int) -> bytes:
    """The request frame with its ``timeout_hint`` cut to what is left of the call's deadline; a body that is no
    frame unchanged (the Dispatcher answers it INVALID_FRAME)."""
    try:
        frame = _frames.decode(body)
    except msgspec.DecodeError:
        return body
    if frame.timeout_hint is not None and frame.timeout_hint <= left_ms:
        return body
    return _encoder.encode(msgspec.structs.replace(frame, timeout_hint=left_ms))


async def _backed_off(failures: int, what: str, exc: BaseException) -> int:
    log.warning("mq_broker_unreachable", extra={"stream": what, "error": str(exc)})
    await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
    return failures + 1
