"""Errors as values: a code, an HTTP status, a human message and the offending field.

Every error the registry, the router and the console answer has one shape,
``{"error": code, "message": text, "field": path}``, built by the SDK's ``error_body`` (agents answer in it too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
from agent_reach.connections import error_body

_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_FIELD_NAME = re.compile(r"field `(?P<name>[^`]+)`")


class ApiError(Exception):
    """Raised by a handler (or what it calls) to answer ``status`` with the envelope; ``details`` join the
    body, ``headers`` the response."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, *,
                 headers: Mapping[str, str] | None = None, **details: object):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers, self.details = headers, details

    def body(self) -> dict[str, object]:
        return {**error_body(self.code, self.message, self.field), **self.details}


def from_decode_error(exc: msgspec.MsgspecError, prefix: str = "") -> ApiError:
    """Turn msgspec's message ("Expected `int`, got `str` - at `$.a[0].b`") into a 400 naming the field."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return ApiError(400, "invalid_json", f"Body is not valid JSON: {text}")
    match = _AT_PATH.search(text)
    path = match.group("path").lstrip(".") if match else ""
    message = _AT_PATH.sub("", text)
    named = _FIELD_NAME.search(message)
    if named and ("unknown field" in message or "missing required field" in message):
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    code = "unknown_field" if "unknown field" in message else (
        "missing_field" if "missing required field" in message else "invalid_field")
    field = ".".join(part for part in (prefix, path) if part) or None
    return ApiError(400, code, message, field)
