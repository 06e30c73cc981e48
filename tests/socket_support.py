"""A hand-written WebSocket agent on 127.0.0.1 speaking agent_reach.socket_wire, whose answer to each call a test
scripts (silent, one chunk then silence, garbage, a dropped connection...), recording every message it got."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from agent_reach.socket_wire import Envelope, decode, encode
from aiohttp import WSMsgType, web

from recording_support import Received, RecordingServer, starting

Script = Callable[["SocketCall"], Awaitable[None]]


class SocketCall:
    """One call as the scripted agent got it, and the means to answer it."""

    def __init__(self, socket: web.WebSocketResponse, envelope: Envelope, body: bytes):
        self.socket = socket
        self.envelope = envelope
        self.frame = json.loads(body)

    async def send(self, kind: str, body: Any, *, status: int = 200, call_id: str | None = None) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        await self.socket.send_bytes(encode(Envelope(type=kind, id=call_id or self.envelope.id,  # type: ignore[arg-type]
                                                     status=status), raw))

    async def chunk(self, seq: int, data: Any) -> None:
        await self.send("chunk", {"request_id": self.envelope.id, "seq": seq, "data": data})

    async def reply(self, result: Any) -> None:
        await self.send("reply", {"request_id": self.envelope.id, "status": "success", "result": result})


class ScriptedSocketAgent(RecordingServer):
    """Serves the WebSocket at ``/ws`` (a recording server: ``kill`` resets it as a killed process would);
    each call runs ``script`` as its own task."""

    protocol = "websocket"

    def __init__(self, name: str, script: Script):
        super().__init__(self._serve)
        self.name = name
        self.script = script
        self.calls: list[SocketCall] = []
        self.cancels: list[str] = []
        self.connections = 0
        self.closed = 0
        # Cleared: the agent stops reading its socket (its buffers fill, and the router's writes wait).
        self.reading = asyncio.Event()
        self.reading.set()

    @property
    def endpoint(self) -> str:
        return f"{self.url}/ws"

    async def _serve(self, request: web.Request, received: Received) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self.connections += 1
        tasks: set[asyncio.Task[None]] = set()
        while True:
            await self.reading.wait()
            message = await socket.receive()
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
            if message.type is not WSMsgType.BINARY:
                continue
            envelope, body = decode(message.data)
            if envelope.type == "cancel":
                self.cancels.append(envelope.id)
                continue
            call = SocketCall(socket, envelope, body)
            self.calls.append(call)
            task = asyncio.create_task(self.script(call))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in tasks:
            task.cancel()
        self.closed += 1
        return socket


@pytest.fixture
async def socket_agent() -> AsyncIterator[Callable[[str, Script], Awaitable[ScriptedSocketAgent]]]:
    async with starting(ScriptedSocketAgent) as start:
        yield start
