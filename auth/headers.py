"""Where a credential travels in a request: `X-API-Key`, or `Authorization: Bearer`."""

from __future__ import annotations

from collections.abc import Mapping


def bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, credential = value.partition(" ")
    return credential.strip() or None if scheme.lower() == "bearer" else None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents, from either place; `X-API-Key` wins when both are sent."""
    return headers.get("X-API-Key") or bearer(headers)
