"""Intent → capability for the router: follows the registry mirror, embeds, matches, decides.

The model runs on its own worker thread, capability vectors are computed when the mirror changes
(not per call), and intent vectors are cached, so a repeated intent costs one matrix product.
"""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
from agent_reach.atp import ErrorCode

from router.mirror import RegistryMirror
from semantic.cache import LruCache, intent_key
from semantic.embedder import AsyncEmbedder
from semantic.index import CapabilityIndex, described_capabilities
from semantic.matcher import MatchRule, decide
from semantic.outcome import IntentMatch, IntentRefusal
from semantic.settings import SemanticSettings


class SemanticStats(msgspec.Struct, kw_only=True):
    model: str
    capabilities: int
    indexed: int
    active: bool
    cache_entries: int
    cache_hits: int
    cache_misses: int


class SemanticRouter:
    def __init__(self, mirror: RegistryMirror, embedder: AsyncEmbedder, settings: SemanticSettings):
        model = embedder.model
        self.mirror = mirror
        self.settings = settings
        self.rule = MatchRule(threshold=model.threshold if settings.threshold is None else settings.threshold,
                              margin=model.margin if settings.margin is None else settings.margin,
                              top_k=settings.top_k)
        self.embedder = embedder
        self.index = CapabilityIndex(embedder)
        self.cache: LruCache[np.ndarray] = LruCache(settings.cache_size)
        self._described = 0
        self._revision: int | None = None
        self._refreshing = asyncio.Lock()

    @classmethod
    async def create(cls, mirror: RegistryMirror, settings: SemanticSettings) -> SemanticRouter:
        """Load the model (from its wheel, off the loop) and index the mirror's capabilities."""
        router = cls(mirror, await AsyncEmbedder.load(settings.model), settings)
        await router.refresh()
        return router

    @property
    def active(self) -> bool:
        return self._described <= self.settings.max_capabilities

    async def refresh(self) -> None:
        """Bring the index in line with the mirror if the registry changed since the last look."""
        async with self._refreshing:
            revision = self.mirror.revision
            if revision == self._revision:
                return
            wanted = described_capabilities(self.mirror.keys)
            self._described = len(wanted)
            await self.index.update(wanted if self.active else [])
            self._revision = revision

    async def follow(self, interval: float = 0.25) -> None:
        """Refresh whenever the mirror moves, so capabilities are embedded as they register, not on a call."""
        while True:
            await self.refresh()
            await asyncio.sleep(interval)

    async def resolve(self, intent: str) -> IntentMatch | IntentRefusal:
        """The capability ``intent`` asks for, or a refusal listing the top candidates."""
        if self.mirror.revision != self._revision:
            await self.refresh()
        if not self.active:
            return IntentRefusal(code=ErrorCode.INTENT_UNMATCHED, candidates=[], message=(
                f"Semantic matching is off: {self._described} capabilities are described, more than the "
                f"{self.settings.max_capabilities} it is enabled for; name the capability"))
        names, scores = self.index.scores(await self.vector(intent))
        return decide(names, scores, self.rule)

    async def vector(self, intent: str) -> np.ndarray:
        """The unit vector of ``intent``, from the cache or the model."""
        key = intent_key(intent)
        vector = self.cache.get(key)
        if vector is None:
            vector = (await self.embedder.encode([key]))[0]
            self.cache.put(key, vector)
        return vector

    def stats(self) -> SemanticStats:
        return SemanticStats(model=self.embedder.model.name, capabilities=self._described,
                             indexed=len(self.index.names), active=self.active, cache_entries=len(self.cache),
                             cache_hits=self.cache.hits, cache_misses=self.cache.misses)

    def close(self) -> None:
        self.embedder.close()
