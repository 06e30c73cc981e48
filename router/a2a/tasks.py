"""The A2A tasks this router ran: in flight (cancellable) or finished a short while ago, in bounded memory.

An A2A task is one ATP call (its id is the call's request_id). ``tasks/get`` and ``tasks/cancel`` find it
here, and only for the client that made it: a task id is no capability to read another's answer.
Finished tasks are kept for ``keep_s`` and while their results fit ``max_result_bytes`` together, at most
``max_tasks`` of them; the oldest go first. Tasks in flight are never dropped (each holds a live call).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import msgspec
from agent_reach.atp import RouteFacts

WORKING, COMPLETED, FAILED, CANCELED, REJECTED = "working", "completed", "failed", "canceled", "rejected"


class TaskEntry(msgspec.Struct, kw_only=True):
    id: str
    context_id: str
    capability: str | None
    owner: str | None  # the caller's client_id; None with authentication off
    state: str = WORKING
    result: msgspec.Raw | None = None
    error_code: str | None = None
    error_message: str = ""
    route: RouteFacts | None = None
    context_update: dict[str, Any] | None = None
    finished_at: float | None = None
    call: asyncio.Future[Any] | None = None

    @property
    def final(self) -> bool:
        return self.state != WORKING

    @property
    def size(self) -> int:
        return len(self.result) if self.result is not None else 0


class TaskBook:
    def __init__(self, max_tasks: int = 1000, max_result_bytes: int = 32 * 1024 * 1024, keep_s: float = 600.0):
        self.max_tasks = max_tasks
        self.max_result_bytes = max_result_bytes
        self.keep_s = keep_s
        self._working: dict[str, TaskEntry] = {}
        self._finished: OrderedDict[str, TaskEntry] = OrderedDict()
        self._finished_bytes = 0

    def open(self, entry: TaskEntry) -> TaskEntry:
        self._working[entry.id] = entry
        return entry

    def drop(self, entry: TaskEntry) -> None:
        """A call refused before it became a task (answered as a JSON-RPC error): nothing to look up later."""
        self._working.pop(entry.id, None)

    def finish(self, entry: TaskEntry) -> None:
        entry.call = None
        entry.finished_at = time.monotonic()
        self._working.pop(entry.id, None)
        self._finished[entry.id] = entry
        self._finished_bytes += entry.size
        self._prune(entry.finished_at)

    def find(self, task_id: str, owner: str | None) -> TaskEntry | None:
        self._prune(time.monotonic())
        entry = self._working.get(task_id) or self._finished.get(task_id)
        return entry if entry is not None and entry.owner == owner else None

    def _prune(self, now: float) -> None:
        finished = self._finished
        while finished:
            oldest = next(iter(finished.values()))
            assert oldest.finished_at is not None
            if (len(finished) <= self.max_tasks and self._finished_bytes <= self.max_result_bytes
                    and now - oldest.finished_at < self.keep_s):
                return
            del finished[oldest.id]
            self._finished_bytes -= oldest.size
