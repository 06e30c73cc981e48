"""Raw HTTP over a real socket: bytes that aiohttp's client refuses to send (non-UTF-8 headers,
oversized lines, broken encodings) reach the server exactly as written, and clients that send slowly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from agent_reach.admission import Limits
from agent_reach.connections import GuardedSite
from agent_reach.serving import listen
from aiohttp import web


class RawAnswer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(url: str, method: str, path: str, headers: list[tuple[bytes, bytes]] = (),
                      body: bytes = b"", target: bytes | None = None) -> RawAnswer:
    """One request on a fresh connection (closed after the answer); ``target`` overrides ``path`` as raw bytes."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        lines = [method.encode() + b" " + (target or path.encode()) + b" HTTP/1.1",
                 b"Host: " + parts.netloc.encode(), b"Connection: close", b"Content-Length: %d" % len(body)]
        lines += [name + b": " + value for name, value in headers]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answer_headers = dict(line.split(": ", 1) for line in header_lines)
    return RawAnswer(int(status_line.split(" ")[1]), answer_headers, payload)


# Slow clients, as slowloris is: a header (or body) begun and never finished, from a chosen loopback address.
PARTIAL_HEADER = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


async def slow_connection(port: int, first: bytes = PARTIAL_HEADER,
                          source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``source`` (any of 127.0.0.0/8 reaches the server over lo) that sent ``first``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(first)
    await writer.drain()
    return reader, writer


async def trickle(writers: list[asyncio.StreamWriter], stop: asyncio.Event) -> None:
    """A byte on every connection now and then, as slowloris does, until told to stop or refused."""
    while not stop.is_set():
        for writer in writers:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    writer.write(b"a")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection (b"" when it only closed, or reset it)."""
    try:
        return await reader.read()
    except ConnectionError:
        return b""


@contextlib.asynccontextmanager
async def guarded(app: web.Application, limits: Limits) -> AsyncIterator[tuple[int, GuardedSite]]:
    """``app`` served as every server of the mesh is (agent_reach.serving.listen): its port and guarded site."""
    runner, port = await listen(app, "127.0.0.1", 0, limits=limits)
    site = next(iter(runner.sites))
    assert isinstance(site, GuardedSite)
    try:
        yield port, site
    finally:
        await runner.cleanup()
