"""Structured JSON logs, one object per line, carrying request_id and capability.

Call sites pass context with ``extra={...}``; fields bound with :func:`bind` (a contextvar)
join every line logged inside that task, so a call's request_id and capability reach logs
written deep below the handler without being threaded through every function.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec

_bound: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "agentreach_log_fields", default=MappingProxyType({})
)

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_encoder = msgspec.json.Encoder(enc_hook=str)


class bind:  # noqa: N801  (used as a function: `with logs.bind(request_id=...):`)
    """Add fields to every log line written in this context.

    A class rather than a @contextmanager generator: it runs around every routed call, and the
    generator machinery costs several times more than these two methods."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any):
        self._fields = fields

    def __enter__(self) -> None:
        self._token = _bound.set({**_bound.get(), **self._fields})

    def __exit__(self, *exc_info: object) -> None:
        _bound.reset(self._token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(_bound.get())
        line.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return _encoder.encode(line).decode()


def configure(level: str = "INFO", stream: Any = None) -> None:
    """Send every ``agentreach.*`` logger to one JSON stream (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("agentreach")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
