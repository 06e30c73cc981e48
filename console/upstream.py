"""The console's only way to the mesh: HTTP to the registry and the router, failures as values.

A mesh part that is down must show on screen as "unreachable", not as a console crash, so every
call answers a Reply; a connection failure becomes a 502 Reply in the mesh's error envelope. Given
several URLs of one service, a call whose connection never opened moves on to the next (the SDK's
``Failover`` policy, decision 34); any other failure is answered as is, since the call may have landed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.connections import error_body
from agent_reach.headers import API_KEY_HEADER
from agent_reach.transport import Failover
from yarl import URL

from console.admin_key import AdminKey

TIMEOUT = aiohttp.ClientTimeout(total=10, connect=2)
_decoder = peer_json.Decoder()


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


def failure(url: URL, exc: BaseException) -> str:
    return f"{url}: {str(exc) or type(exc).__name__}"


def unreachable(reason: str) -> Reply:
    return Reply(status=502, body=msgspec.json.encode(error_body("upstream_unreachable", reason)))


def redirected(url: URL, status: int, location: str) -> Reply:
    """No part of the mesh redirects; one that does is shown failing, not followed (see Upstream._send)."""
    return Reply(status=502, body=msgspec.json.encode(error_body(
        "upstream_redirected", f"{url} answered {status}, a redirect to {location!r}, which the console does not "
                               "follow")))


class Upstream:
    """Requests to one service (the registry or the router, at one URL or several), each with a
    deadline, each carrying the admin key when the console has one (their admin endpoints need it).
    A 401 to the admin key may mean it was rotated: the key is looked up again and the call tried once more."""

    def __init__(self, session: aiohttp.ClientSession, base_urls: str | Sequence[str], admin: AdminKey | None = None,
                 judges_admin_key: bool = False):
        self.session = session
        self.urls = Failover(base_urls)
        self.admin = admin
        # The registry's refusal of the admin key is final; a router's may only mean it lags behind.
        self.judges_admin_key = judges_admin_key

    async def request(self, method: str, path: str, body: bytes | None = None, params: dict[str, str] | None = None,
                      headers: dict[str, str] | None = None, conditions: dict[str, str] | None = None) -> Reply:
        """``headers`` replace the admin key (the debug entry calls /atp as a caller, not as the admin);
        ``conditions`` (``If-Match``) go along with whichever credential is sent."""
        extra = conditions or {}
        if headers is not None or self.admin is None:
            return await self._send(method, path, body, params, {**(headers or {}), **extra})
        sent = self.admin.key
        reply = await self._send(method, path, body, params, {**credential(sent), **extra})
        if reply.status == 401 and self.admin.refused(sent, final=self.judges_admin_key):
            reply = await self._send(method, path, body, params, {**credential(self.admin.key), **extra})
        return reply

    async def _send(self, method: str, path: str, body: bytes | None, params: dict[str, str] | None,
                    headers: dict[str, str]) -> Reply:
        if body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        failures: list[str] = []
        for base_url in self.urls.order():
            url = URL(f"{base_url}{path}", encoded=True)  # path segments arrive already quoted
            started = time.monotonic()
            try:  # a redirect is never followed: it would carry the admin key to wherever it points
                async with self.session.request(method, url, data=body, params=params, headers=headers,
                                                timeout=TIMEOUT, allow_redirects=False) as response:
                    data = await response.read()
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                self.urls.failed(base_url)
                failures.append(failure(url, exc))
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                return unreachable(failure(url, exc))
            self.urls.answered(base_url)
            if 300 <= response.status < 400:
                return redirected(url, response.status, response.headers.get("Location", ""))
            return Reply(status=response.status, body=data, headers=dict(response.headers),
                         elapsed_ms=(time.monotonic() - started) * 1000)
        return unreachable("; ".join(failures))

    async def get(self, path: str, params: dict[str, str] | None = None) -> Reply:
        return await self.request("GET", path, params=params)


def credential(key: str | None) -> dict[str, str]:
    return {API_KEY_HEADER: key} if key else {}
