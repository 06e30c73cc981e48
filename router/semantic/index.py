"""Capability vectors: embedded once per (name, description, examples), scored with one product.

A capability is one unit vector: the normalised mean of the vectors of its description and of
each of its examples. On the evaluation set the mean places the right capability first far more
often than the best single text does (93% against 84% with the default model): one example that
shares a word with an unrelated intent no longer decides alone. A match is then one
matrix-vector product over every capability.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec
import numpy as np
from agent_reach.registration import Capability

from mesh.keyspace import KeySpace
from router.semantic.embedder import AsyncEmbedder, unit_rows


class CapabilityText(msgspec.Struct, frozen=True):
    """What a capability says about itself: the texts an intent is compared with."""

    name: str
    texts: tuple[str, ...]


def capability_text(name: str, texts: Iterable[str]) -> CapabilityText:
    """Distinct non-blank texts in a stable order, so an unchanged capability compares equal."""
    distinct = {text.strip() for text in texts}
    distinct.discard("")
    return CapabilityText(name, tuple(sorted(distinct)))


def declared_texts(declared: Iterable[Capability]) -> list[str]:
    """Description and examples of every instance's declaration (instances may run different versions)."""
    return [text for capability in declared for text in (capability.description, *capability.examples)]


def described_capabilities(keys: KeySpace) -> list[CapabilityText]:
    """What every offered capability says about itself: its declarations and its accepted learned examples."""
    wanted = []
    for name, offers in sorted(keys.offers.items()):
        learned = [example.text for example in keys.examples.get(name, {}).values() if example.state == "accepted"]
        entry = capability_text(name, [*declared_texts(offers.values()), *learned])
        if entry.texts:
            wanted.append(entry)
    return wanted


class _Matrix(msgspec.Struct, frozen=True):
    names: list[str]
    rows: np.ndarray


_EMPTY = _Matrix([], np.empty((0, 0), dtype=np.float32))


def _assemble(entries: dict[str, np.ndarray]) -> _Matrix:
    names = sorted(entries)
    return _Matrix(names, np.stack([entries[name] for name in names])) if names else _EMPTY


class CapabilityIndex:
    """The capabilities the router may match intents to, as one matrix of unit rows."""

    def __init__(self, embedder: AsyncEmbedder):
        self._embedder = embedder
        self._entries: dict[str, tuple[CapabilityText, np.ndarray]] = {}
        self._matrix = _EMPTY
        self._lock = asyncio.Lock()

    @property
    def names(self) -> list[str]:
        return self._matrix.names

    async def update(self, wanted: Iterable[CapabilityText]) -> None:
        """Make the index hold exactly ``wanted``; embeds only capabilities new or changed since last time."""
        async with self._lock:
            wanted_by_name = {entry.name: entry for entry in wanted if entry.texts}
            fresh = [entry for name, entry in wanted_by_name.items()
                     if name not in self._entries or self._entries[name][0] != entry]
            if not fresh and wanted_by_name.keys() == self._entries.keys():
                return
            entries = {name: self._entries[name] for name in wanted_by_name if name in self._entries}
            if fresh:
                vectors = await self._embedder.encode([text for entry in fresh for text in entry.texts])
                groups = np.split(vectors, np.cumsum([len(entry.texts) for entry in fresh])[:-1])
                centroids = unit_rows(np.stack([group.mean(axis=0) for group in groups]))
                entries.update((entry.name, (entry, centroid))
                               for entry, centroid in zip(fresh, centroids, strict=True))
            self._entries = entries
            self._matrix = await asyncio.to_thread(_assemble, {name: row for name, (_, row) in entries.items()})

    def scores(self, vector: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Every capability's cosine similarity to ``vector`` (a unit vector), aligned with the names."""
        matrix = self._matrix
        return matrix.names, matrix.rows @ vector if matrix.names else np.empty(0, dtype=np.float32)
