"""OAuth2 client credentials for callers: one token, fetched when needed, reused until near expiry."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgspec

from agent_reach import peer_json

# Refresh this long before the token expires, so a call never leaves with a token about to lapse.
EXPIRY_MARGIN = 30.0


class TokenAnswer(msgspec.Struct):
    access_token: str
    expires_in: float = 3600.0


class TokenRefused(Exception):
    """No token: the endpoint refused or answered nonsense (transport failures propagate as is: asking
    again, elsewhere, is always safe)."""


class ClientCredentials:
    def __init__(self, token_url: str, client_id: str, client_secret: str):
        self.token_url = token_url
        self._basic = aiohttp.encode_basic_auth(client_id, client_secret)
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def authorization(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> str:
        """The ``Authorization`` header value; transport failures (no connection, no answer in time, a
        connection broken off) propagate as aiohttp's errors or TimeoutError, so callers can fall back."""
        async with self._lock:
            if self._token is None or time.monotonic() >= self._expires:
                answer = await self._fetch(session, timeout)
                self._token = answer.access_token
                self._expires = time.monotonic() + max(0.0, answer.expires_in - EXPIRY_MARGIN)
            return f"Bearer {self._token}"

    async def _fetch(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> TokenAnswer:
        async with session.post(self.token_url, data={"grant_type": "client_credentials"},
                                headers={"Authorization": self._basic}, timeout=timeout) as response:
            body = await response.read()
        if response.status != 200:
            raise TokenRefused(f"{self.token_url} answered {response.status}: {body[:200]!r}")
        try:
            return peer_json.decode(body, type=TokenAnswer)
        except msgspec.DecodeError as exc:
            raise TokenRefused(f"{self.token_url} answered without a token: {exc}") from exc
