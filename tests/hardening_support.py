"""Raw HTTP over a real socket: bytes that aiohttp's client refuses to send (non-UTF-8 headers,
oversized lines, broken encodings) reach the server exactly as written."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


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
