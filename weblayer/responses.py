"""JSON answers, and request bodies decoded into Structs with msgspec's complaints as 400s naming the field."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from weblayer.errors import ApiError, from_decode_error

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json",
                        headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(error.body(), error.status, error.headers)


@functools.cache
def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    """One decoder per type, built on first use: building one costs more than decoding a small body."""
    return msgspec.json.Decoder(kind)


async def read_json(request: web.Request, kind: type[T]) -> T:
    """The body as a ``kind``; anything else is a 400 saying which field is wrong."""
    body = await request.read()
    try:
        return _decoder(kind).decode(body)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


def converted(value: Any, kind: type[T], field: str) -> T:
    """``value`` (a path segment, a query parameter) held to the rules of ``kind``, refused as ``field``."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc, prefix=field) from None
