"""Sticky sessions: which instance served a session last, for ``ttl`` seconds, in bounded memory."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


def sticky_key(capability: str, context: dict[str, Any], field: str) -> str | None:
    """The table key for a call: its capability and the value of ``context[field]``; None if absent."""
    value = context.get(field)
    if value is None or value == "":
        return None
    return f"{capability}\x00{value}"


class StickyTable:
    """Key -> (agent_id, expires_at), oldest written first; full means the oldest entry goes."""

    def __init__(self, max_entries: int = 100_000):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        agent_id, expires_at = entry
        if now >= expires_at:
            del self._entries[key]
            return None
        return agent_id

    def put(self, key: str, agent_id: str, ttl: float, now: float) -> None:
        """Remember (or refresh) the session's instance; writing a key makes it the newest."""
        self._entries[key] = (agent_id, now + ttl)
        self._entries.move_to_end(key)
        self._drop_expired_front(now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _drop_expired_front(self, now: float) -> None:
        """Reclaim expired entries among the oldest written; cheap, and enough to keep memory down."""
        while self._entries:
            _, expires_at = next(iter(self._entries.values()))
            if now < expires_at:
                return
            self._entries.popitem(last=False)
