"""The console's only way to the mesh: HTTP to the registry and the router, failures as values.

A mesh part that is down must show on screen as "unreachable", not as a console crash, so every
call answers a Reply; a connection failure becomes a 502 Reply in the registry's error shape.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import msgspec
from yarl import URL

TIMEOUT = aiohttp.ClientTimeout(total=10, connect=2)
_decoder = msgspec.json.Decoder()


class Reply(msgspec.Struct, kw_only=True):
    status: int
    body: bytes
    headers: dict[str, str] = {}
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return _decoder.decode(self.body) if self.body else None

    def error(self) -> str:
        """A one-line reason for an unsuccessful reply, for the upstream status indicator."""
        try:
            body = self.json()
        except msgspec.DecodeError:
            body = None
        if isinstance(body, dict) and body.get("message"):
            return f"{self.status}: {body['message']}"
        return f"HTTP {self.status}"


def unreachable(url: URL, exc: BaseException) -> Reply:
    body = {"error": "upstream_unreachable", "message": f"{url}: {str(exc) or type(exc).__name__}", "field": None}
    return Reply(status=502, body=msgspec.json.encode(body))


class Upstream:
    """Requests to one base URL (the registry's or the router's), each with a deadline, each
    carrying the admin key when the console has one (their admin endpoints need it)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, admin_key: str | None = None):
        self.session = session
        self.base_url = base_url.rstrip("/")
        self._credential = {"X-API-Key": admin_key} if admin_key else {}

    async def request(self, method: str, path: str, body: bytes | None = None, params: dict[str, str] | None = None,
                      headers: dict[str, str] | None = None) -> Reply:
        """``headers`` replace the admin key (the debug entry calls /atp as a caller, not as the admin)."""
        url = URL(f"{self.base_url}{path}", encoded=True)  # path segments arrive already quoted
        headers = {**(self._credential if headers is None else headers),
                   **({"Content-Type": "application/json"} if body is not None else {})}
        started = time.monotonic()
        try:
            async with self.session.request(method, url, data=body, params=params, headers=headers,
                                            timeout=TIMEOUT) as response:
                data = await response.read()
                return Reply(status=response.status, body=data, headers=dict(response.headers),
                             elapsed_ms=(time.monotonic() - started) * 1000)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return unreachable(url, exc)

    async def get(self, path: str, params: dict[str, str] | None = None) -> Reply:
        return await self.request("GET", path, params=params)
