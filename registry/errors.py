"""Registry errors as values: a code, an HTTP status, a human message and the offending field."""

from __future__ import annotations

import re

import msgspec

_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_FIELD_NAME = re.compile(r"field `(?P<name>[^`]+)`")


class RegistryError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None, **details: object):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.details = details

    def body(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message, "field": self.field, **self.details}


def from_decode_error(exc: msgspec.MsgspecError, prefix: str = "") -> RegistryError:
    """Turn msgspec's message ("Expected `int`, got `str` - at `$.a[0].b`") into a 400 naming the field."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return RegistryError(400, "invalid_json", f"Body is not valid JSON: {text}")
    match = _AT_PATH.search(text)
    path = match.group("path").lstrip(".") if match else ""
    message = _AT_PATH.sub("", text)
    named = _FIELD_NAME.search(message)
    if named and ("unknown field" in message or "missing required field" in message):
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    code = "unknown_field" if "unknown field" in message else (
        "missing_field" if "missing required field" in message else "invalid_field")
    field = ".".join(part for part in (prefix, path) if part) or None
    return RegistryError(400, code, message, field)
