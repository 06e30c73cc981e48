"""What a request says, held to a type: the body as a Struct, a path segment, a bounded query number.
What does not fit is an ApiError (400) naming the field, never a half-read request."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from agent_reach import peer_json
from aiohttp import web

from weblayer.errors import ApiError, from_decode_error

T = TypeVar("T")


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    """One decoder per type, built on first use: building one costs more than decoding a small body."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


async def read_json(request: web.Request, kind: type[T]) -> T:
    """The body as a ``kind``; anything else is a 400 saying which field is wrong. The registry passes what it
    reads on (a policy's floor answer, in the watch feed), so its nesting is held to MAX_PASSED_DEPTH."""
    body = await request.read()
    try:
        peer_json.check(body, peer_json.MAX_PASSED_DEPTH)
        return _decoder(kind).decode(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


def converted(value: Any, kind: type[T], field: str) -> T:
    """``value`` (a path segment, a query parameter) held to the rules of ``kind``, refused as ``field``."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc, prefix=field) from None


def whole_number(raw: str, most_digits: int) -> int | None:
    """``raw`` as a whole number of ASCII digits, at most ``most_digits`` of them; None when it is not one.
    ``isdigit`` alone also holds for '²' (which int() refuses) and for 5000 digits (int() refuses over 4300)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= most_digits):
        return None
    return int(raw)


def bounded_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter ``name`` as a whole number from ``low`` to ``high`` (``default`` when absent)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    number = whole_number(raw, len(str(high)))
    if number is None or not low <= number <= high:
        raise ApiError(400, "invalid_field", f"{name} must be a whole number from {low} to {high}", name)
    return number
