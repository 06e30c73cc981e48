"""Capability vectors: embedded once per (name, description, examples), scored with one product.

A capability is one unit vector: the normalised mean of the vectors of its description and of
each of its examples. On the evaluation set the mean places the right capability first far more
often than the best single text does (93% against 84% with the default model): one example that
shares a word with an unrelated intent no longer decides alone. A match is then one
matrix-vector product over every capability (and one over those that learned examples).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec
import numpy as np
from agent_reach.registration import Capability

from mesh.keyspace import KeySpace
from semantic.embedder import AsyncEmbedder, unit_rows


class CapabilityText(msgspec.Struct, frozen=True):
    """What a capability says about itself (its declarations) and what callers taught it (accepted examples)."""

    name: str
    texts: tuple[str, ...]
    learned: tuple[str, ...] = ()

    @property
    def every_text(self) -> tuple[str, ...]:
        return (*self.texts, *self.learned)


def _distinct(texts: Iterable[str]) -> set[str]:
    distinct = {text.strip() for text in texts}
    distinct.discard("")
    return distinct


def capability_text(name: str, texts: Iterable[str], learned: Iterable[str] = ()) -> CapabilityText:
    """Distinct non-blank texts in a stable order, so an unchanged capability compares equal."""
    declared = _distinct(texts)
    return CapabilityText(name, tuple(sorted(declared)), tuple(sorted(_distinct(learned) - declared)))


def declared_texts(declared: Iterable[Capability]) -> list[str]:
    """Description and examples of every instance's declaration (instances may run different versions)."""
    return [text for capability in declared for text in (capability.description, *capability.examples)]


def described_capabilities(keys: KeySpace) -> list[CapabilityText]:
    """What every offered capability says about itself: its declarations and its accepted learned examples."""
    wanted = []
    for name, offers in sorted(keys.offers.items()):
        learned = [example.text for example in keys.examples.get(name, {}).values() if example.state == "accepted"]
        entry = capability_text(name, declared_texts(offers.values()), learned)
        if entry.every_text:
            wanted.append(entry)
    return wanted


class _Centroids(msgspec.Struct, frozen=True):
    """A capability's unit vectors: the mean of every text, and of its declared texts alone when it learned some."""

    every: np.ndarray
    declared: np.ndarray | None


def _centroids(entry: CapabilityText, vectors: np.ndarray) -> _Centroids:
    every = unit_rows(vectors.mean(axis=0, keepdims=True))[0]
    if not entry.learned or not entry.texts:
        return _Centroids(every, None)
    return _Centroids(every, unit_rows(vectors[:len(entry.texts)].mean(axis=0, keepdims=True))[0])


class _Matrix(msgspec.Struct, frozen=True):
    names: list[str]
    rows: np.ndarray
    # The rows (by position in ``names``) of capabilities with learned examples, and their declared centroids.
    taught: np.ndarray
    declared: np.ndarray


_EMPTY = _Matrix([], np.empty((0, 0), dtype=np.float32), np.empty(0, dtype=np.intp), np.empty((0, 0), np.float32))


def _assemble(entries: dict[str, _Centroids]) -> _Matrix:
    names = sorted(entries)
    if not names:
        return _EMPTY
    taught = [position for position, name in enumerate(names) if entries[name].declared is not None]
    declared = [row for name in names if (row := entries[name].declared) is not None]
    return _Matrix(names, np.stack([entries[name].every for name in names]), np.array(taught, dtype=np.intp),
                   np.stack(declared) if declared else np.empty((0, 0), np.float32))


class CapabilityIndex:
    """The capabilities the router may match intents to, as one matrix of unit rows.

    A capability with learned examples scores the better of its centroid with them and without them.
    The mean of every text alone is not monotone: a learned phrasing pulls the mean towards itself and
    away from phrasings it does not resemble (a Chinese one away from English phrasings), so on the
    evaluation set's held-out half English recall fell from 0.54 to 0.48 as examples were learned.
    With the better of the two, an accepted example never lowers its own capability's score.
    """

    def __init__(self, embedder: AsyncEmbedder):
        self._embedder = embedder
        self._entries: dict[str, tuple[CapabilityText, _Centroids]] = {}
        self._matrix = _EMPTY
        self._lock = asyncio.Lock()

    @property
    def names(self) -> list[str]:
        return self._matrix.names

    async def update(self, wanted: Iterable[CapabilityText]) -> None:
        """Make the index hold exactly ``wanted``; embeds only capabilities new or changed since last time."""
        async with self._lock:
            wanted_by_name = {entry.name: entry for entry in wanted if entry.every_text}
            fresh = [entry for name, entry in wanted_by_name.items()
                     if name not in self._entries or self._entries[name][0] != entry]
            if not fresh and wanted_by_name.keys() == self._entries.keys():
                return
            entries = {name: self._entries[name] for name in wanted_by_name if name in self._entries}
            if fresh:
                vectors = await self._embedder.encode([text for entry in fresh for text in entry.every_text])
                groups = np.split(vectors, np.cumsum([len(entry.every_text) for entry in fresh])[:-1])
                entries.update((entry.name, (entry, _centroids(entry, group)))
                               for entry, group in zip(fresh, groups, strict=True))
            self._entries = entries
            self._matrix = await asyncio.to_thread(_assemble, {name: rows for name, (_, rows) in entries.items()})

    def scores(self, vector: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Every capability's cosine similarity to ``vector`` (a unit vector), aligned with the names."""
        matrix = self._matrix
        if not matrix.names:
            return matrix.names, np.empty(0, dtype=np.float32)
        scores: np.ndarray = matrix.rows @ vector
        if matrix.taught.size:
            scores[matrix.taught] = np.maximum(scores[matrix.taught], matrix.declared @ vector)
        return matrix.names, scores
