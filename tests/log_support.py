"""The agentreach.* log lines a test wrote, each read back as the JSON object it would print."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agent_reach import logs


class LogLines:
    """The agentreach.* log lines written during a test, each as the JSON object it would print."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def named(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]


class _Capture(logging.Handler):
    def __init__(self, sink: LogLines):
        super().__init__(logging.INFO)
        self.setFormatter(logs.JsonFormatter())
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        # Formatting here, in the caller's context, is what binds request_id and capability.
        self._sink.lines.append(json.loads(self.format(record)))


@pytest.fixture
def router_logs() -> Iterator[LogLines]:
    sink = LogLines()
    logger = logging.getLogger("agentreach")
    handler = _Capture(sink)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield sink
    logger.removeHandler(handler)
    logger.setLevel(previous)
