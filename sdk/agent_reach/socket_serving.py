"""An agent's end of ATP over WebSocket (agent_reach.socket_wire): the router's connection to one capability,
many calls on it at once, each served by the same Dispatcher as an HTTP call (signature, deadline, in-flight
count, drain, business errors, streaming), so the protocol changes nothing for the handler.

A call's task ends with its reply; a ``cancel`` message, or the connection closing, cancels it (the router
gave up: the handler sees CancelledError at its next await). A message that is no envelope, or a call whose
id is already in flight on this connection, is logged and dropped; the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict

from agent_reach.dispatch import Dispatcher, Native
from agent_reach.socket_wire import CALL, CANCEL, CHUNK, PING_INTERVAL_S, REPLY, Envelope, WireError, decode, encode
from agent_reach.sse import Chunk

log = logging.getLogger("agentreach.sdk")

_encoder = msgspec.json.Encoder()


class SocketChunks:
    """One call's chunks as ``chunk`` messages on the router's connection."""

    def __init__(self, socket: web.WebSocketResponse, call_id: str):
        self.socket = socket
        self.call_id = call_id

    @contextlib.contextmanager
    def watch(self, caller_gone: Callable[[], Any]) -> Iterator[bool]:
        """Nothing to hook: the router leaving cancels the call's own task (a cancel message, or the close)."""
        yield True

    async def chunk(self, request_id: str, seq: int, data: msgspec.Raw) -> None:
        if self.socket.closed:
            raise ConnectionResetError("the router's connection closed")
        await self.socket.send_bytes(encode(Envelope(type=CHUNK, id=self.call_id),
                                            _encoder.encode(Chunk(request_id=request_id, seq=seq, data=data))))


class SocketServer:
    """The agent's open WebSocket connections, one per router and capability, served until they close or the
    agent stops (then each is closed "going away": the router fails new calls over at once)."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.open: set[web.WebSocketResponse] = set()

    async def close(self) -> None:
        await asyncio.gather(*(socket.close(code=WSCloseCode.GOING_AWAY, message=b"agent stopping")
                               for socket in list(self.open)), return_exceptions=True)

    async def serve(self, request: web.Request, native: Native | None, name: str,
                    max_message_bytes: int) -> web.WebSocketResponse:
        """Serve the router's connection for capability ``name`` until it closes."""
        socket = web.WebSocketResponse(heartbeat=PING_INTERVAL_S, max_msg_size=max_message_bytes)
        await socket.prepare(request)
        self.open.add(socket)
        calls: dict[str, asyncio.Task[None]] = {}
        try:
            async for message in socket:
                if message.type is WSMsgType.ERROR:  # the connection failed (a ping unanswered, a message too big)
                    log.warning("websocket_connection_failed", extra={"capability": name,
                                                                      "error": repr(message.data)})
                    break
                if message.type is not WSMsgType.BINARY:
                    log.warning("websocket_message_refused", extra={
                        "capability": name, "why": f"{message.type.name} message; this protocol sends binary ones"})
                    continue
                try:
                    envelope, body = decode(message.data)
                except WireError as exc:
                    log.warning("websocket_message_refused", extra={"capability": name, "why": str(exc)})
                    continue
                if envelope.type == CANCEL:
                    if (running := calls.get(envelope.id)) is not None:
                        running.cancel()
                elif envelope.type != CALL:
                    log.warning("websocket_message_refused", extra={
                        "capability": name, "request_id": envelope.id,
                        "why": f"a router does not send {envelope.type!r}"})
                elif envelope.id in calls:
                    log.warning("websocket_message_refused", extra={
                        "capability": name, "request_id": envelope.id,
                        "why": "a call with this id is in flight already"})
                else:
                    calls[envelope.id] = asyncio.create_task(
                        _serve_call(socket, self.dispatcher, native, name, envelope, body))
                    calls[envelope.id].add_done_callback(functools.partial(_forget, calls, envelope.id))
        finally:
            self.open.discard(socket)
            for task in list(calls.values()):
                task.cancel()
            await asyncio.gather(*calls.values(), return_exceptions=True)
        return socket


def _forget(calls: dict[str, asyncio.Task[None]], call_id: str, _: asyncio.Task[None]) -> None:
    calls.pop(call_id, None)


async def _serve_call(socket: web.WebSocketResponse, dispatcher: Dispatcher, native: Native | None, name: str,
                      envelope: Envelope, body: bytes) -> None:
    reply = await dispatcher.handle(native, name, body, CIMultiDict(envelope.headers),
                                    caller_gone=lambda: socket.closed, out=SocketChunks(socket, envelope.id))
    with contextlib.suppress(ConnectionError):
        await socket.send_bytes(encode(Envelope(type=REPLY, id=envelope.id, status=reply.status), reply.body))
