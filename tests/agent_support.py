"""Agents for the router's tests, all plain aiohttp with no SDK: an echo agent whose behaviour can be
changed while it runs, a scripted agent that answers exactly the bytes it is given (both recording
servers), and a target whose TCP handshake never completes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self

import aiohttp
import pytest
from aiohttp import web

from recording_support import Loopback, Received, RecordingServer, starting


class CallEndpoint(Loopback):
    """Something on 127.0.0.1 whose capability endpoint is ``/call``."""

    @property
    def endpoint(self) -> str:
        return f"{self.url}/call"


class Agent(CallEndpoint, RecordingServer):
    """A plain aiohttp agent on 127.0.0.1 (a recording server) whose behaviour can be changed while it runs.

    ``protocol`` "rest": the body is the payload, the answer ``{"echo": payload, "agent": name}``.
    ``protocol`` "atp": the body is a request frame, the answer a response frame whose result is
    the same echo. Knobs: ``status`` (answer this HTTP status with an error body), ``business_error``
    (answer HTTP 200 carrying it), ``first_byte_delay`` (seconds before the status line),
    ``body_delay`` (status line at once, the rest of the body that much later), ``gate`` (hold every
    call until the event is set), ``report_completion`` (POST the router's completion URL once done).
    """

    def __init__(self, name: str, protocol: str = "rest"):
        super().__init__(self._call)
        self.name = name
        self.protocol = protocol
        self.status = 200
        self.business_error: dict[str, Any] | None = None
        self.first_byte_delay = 0.0
        self.body_delay = 0.0
        self.gate: asyncio.Event | None = None
        self.report_completion = False
        self.inflight = 0
        self.completions: list[dict[str, Any]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def calls(self) -> int:
        return len(self.received)

    async def start(self, port: int = 0) -> Self:
        await super().start(port)
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        """Calls held at the gate are let go (answered), not cut off, then the server stops."""
        if self.gate is not None:
            self.gate.set()
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, request: web.Request, received: Received) -> web.StreamResponse:
        body = received.json()
        self.inflight += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.first_byte_delay:
                await asyncio.sleep(self.first_byte_delay)
            status, answer = self._answer(body)
            if self.report_completion:
                await self._report(request, (time.monotonic() - received.arrived) * 1000)
        finally:
            self.inflight -= 1
        data = json.dumps(answer).encode()
        if not self.body_delay:
            return web.Response(body=data, status=status, content_type="application/json")
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(data[:1])
        await asyncio.sleep(self.body_delay)
        await response.write(data[1:])
        await response.write_eof()
        return response

    def _answer(self, body: Any) -> tuple[int, Any]:
        if self.protocol == "rest":
            if self.status != 200:
                return self.status, {"error": f"{self.name} answers {self.status}"}
            if self.business_error is not None:
                return 200, {"business_error": self.business_error}
            return 200, {"echo": body, "agent": self.name}
        request_id = body.get("request_id") if isinstance(body, dict) else None
        if self.status != 200:
            return self.status, {"request_id": request_id, "error_code": "AGENT_ERROR",
                                 "error_message": f"{self.name} answers {self.status}", "can_retry": True}
        frame: dict[str, Any] = {"request_id": request_id, "status": "success",
                                 "result": {"echo": body.get("payload"), "agent": self.name},
                                 "context_update": {"served_by": self.name}}
        if self.business_error is not None:
            frame["business_error"] = self.business_error
        return 200, frame

    async def _report(self, request: web.Request, finished_ms: float) -> None:
        url = request.headers.get("X-Reach-Completion-Url")
        if url is None or self._session is None:
            return
        note = {"request_id": request.headers["X-Request-Id"], "agent_id": self.name, "finished_ms": finished_ms}
        async with self._session.post(url, json=note) as answer:
            self.completions.append({"status": answer.status, **await answer.json()})


class SlowConnectTarget(CallEndpoint):
    """A port whose TCP handshake never completes: a listening socket with backlog 0 that never
    accepts, its accept queue filled by our own connections, so the kernel drops new SYNs."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self._fillers: list[socket.socket] = []

    async def start(self) -> SlowConnectTarget:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(filler)
        # Prove the trick works here: a fresh connect must hang rather than complete or be refused.
        try:
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 0.2)
        except TimeoutError:
            return self
        raise AssertionError("the filled backlog did not make connects hang")

    def close(self) -> None:
        for filler in self._fillers:
            filler.close()
        self._listener.close()


@pytest.fixture
async def start_agent() -> AsyncIterator[Callable[..., Awaitable[Agent]]]:
    """``await start_agent(name, protocol="rest")``: a running Agent, stopped at teardown."""
    async with starting(Agent) as start:
        yield start


class ScriptedAgent(CallEndpoint, RecordingServer):
    """An agent answering exactly the bytes it is given: ``status``, ``body`` and ``headers``; or, with
    ``stream`` set, a JSON string of that many bytes written in 64 KiB chunks (no Content-Length unless
    ``declare_length``). It notes how much it wrote and whether the router hung up before the end."""

    def __init__(self, name: str, protocol: str = "rest"):
        super().__init__(self._answer)
        self.name = name
        self.protocol = protocol
        self.status = 200
        self.body = b"{}"
        self.headers: dict[str, str] = {}
        self.stream = 0
        self.declare_length = False
        self.written = 0
        self.cut_off = asyncio.Event()

    @property
    def calls(self) -> int:
        return len(self.at("/call"))

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        if received.path != "/call":
            # Where the agent's redirects point: a router that followed one would get a success here.
            return web.json_response({"followed": True})
        if not self.stream:
            return web.Response(status=self.status, body=self.body,
                                headers={"Content-Type": "application/json", **self.headers})
        length = {"Content-Length": str(self.stream)} if self.declare_length else {}
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json", **length})
        await response.prepare(request)
        chunk = b"a" * 65536
        try:
            await response.write(b'"')
            self.written = 1
            while self.written < self.stream - 1:
                await response.write(chunk)
                self.written += len(chunk)
            await response.write(b'"')
        except ConnectionError:
            self.cut_off.set()
        return response


@pytest.fixture
async def slow_connect() -> AsyncIterator[SlowConnectTarget]:
    target = await SlowConnectTarget().start()
    yield target
    target.close()


@pytest.fixture
async def start_scripted() -> AsyncIterator[Callable[..., Awaitable[ScriptedAgent]]]:
    """``await start_scripted(name, protocol="rest")``: a running ScriptedAgent, stopped at teardown."""
    async with starting(ScriptedAgent) as start:
        yield start


async def answered(mesh: Any, start_scripted: Callable[..., Awaitable[ScriptedAgent]], capability: str, body: bytes,
                   protocol: str = "rest") -> Any:
    """What a caller gets from one call through ``mesh`` to a ScriptedAgent answering ``body``."""
    agent = await start_scripted(f"{capability}-1", protocol=protocol)
    agent.body = body
    await mesh.add(agent, capability)
    return await mesh.call(capability, {"q": 1})
