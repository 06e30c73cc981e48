"""A least-recently-used cache of intent embeddings: a repeated intent skips the model."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

Value = TypeVar("Value")


def intent_key(intent: str) -> str:
    """The cache key of an intent: its words joined by single spaces (spacing carries no meaning)."""
    return " ".join(intent.split())


class LruCache(Generic[Value]):
    def __init__(self, maxsize: int):
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, Value] = OrderedDict()

    def get(self, key: str) -> Value | None:
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: str, value: Value) -> None:
        if self.maxsize == 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.maxsize:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
