"""Where a credential travels in a request: `X-API-Key`, or `Authorization: Bearer`.

aiohttp decodes header bytes that are not UTF-8 into lone surrogates, which no hash or encoder
accepts; a credential is therefore read as the bytes that were sent (latin-1 text), so a garbled
one is simply a key nobody holds (a 401), never an encoding error (a 500).
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_reach.headers import API_KEY_HEADER


def _as_sent(value: str | None) -> str | None:
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("latin-1")


def api_key(headers: Mapping[str, str]) -> str | None:
    return _as_sent(headers.get(API_KEY_HEADER))


def bearer(headers: Mapping[str, str]) -> str | None:
    value = _as_sent(headers.get("Authorization"))
    if value is None:
        return None
    scheme, _, credential = value.partition(" ")
    return credential.strip() or None if scheme.lower() == "bearer" else None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents, from either place; `X-API-Key` wins when both are sent."""
    return api_key(headers) or bearer(headers)
