"""Intent → capability for the router: follows the registry mirror, embeds, matches, decides.

The model runs on its own worker thread, capability vectors are computed when the mirror changes
(not per call), and intent vectors are cached, so a repeated intent costs one matrix product.

With an operator's model (``--embed-model DIR``) matching is a cascade of stages: the shipped model
answers first, and only an intent it refuses as matching nothing goes on to the operator's model,
each stage with its own index, cache and rule. An intent a stage refuses as ambiguous between two
capabilities is refused: a later model that would pick one of them would be guessing where the
first saw a tie. A later stage is skipped for an intent in a language its calibration found it does not
read (mesh/intent_rules.py ``off_languages``): the earlier stage's refusal stands.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np
from agent_reach.atp import ErrorCode, IntentStage

from mesh.intent_rules import IntentRule
from router.mirror import RegistryMirror
from semantic.cache import LruCache, intent_key
from semantic.embedder import AsyncEmbedder
from semantic.index import CapabilityIndex, CapabilityText, described_capabilities
from semantic.language import language
from semantic.matcher import MatchRule, asks_next, decide
from semantic.outcome import IntentMatch, IntentRefusal
from semantic.settings import SemanticSettings

# Where a stage's threshold and margin come from: the router's flags, a calibration stored in the
# registry for its model (mesh/intent_rules.py), or the model's own calibrated defaults.
RuleSource = Literal["flags", "calibrated", "model default", "uncalibrated"]
Outcome = Literal["routed", "unmatched", "ambiguous", "skipped"]
OUTCOMES: dict[ErrorCode, Outcome] = {ErrorCode.INTENT_UNMATCHED: "unmatched", ErrorCode.INTENT_AMBIGUOUS: "ambiguous"}


class StageStats(msgspec.Struct, kw_only=True):
    model: str
    dimensions: int | None
    threshold: float | None
    margin: float | None
    rule: RuleSource
    indexed: int
    cache_entries: int
    cache_hits: int
    cache_misses: int
    # How this stage's answers went: routed, unmatched, ambiguous (each intent it was asked about), and the
    # intents it was skipped for (their language is off for it).
    decided: dict[Outcome, int]


class SemanticStats(msgspec.Struct, kw_only=True):
    model: str
    capabilities: int
    indexed: int
    active: bool
    cache_entries: int
    cache_hits: int
    cache_misses: int
    stages: list[StageStats]


def refusal_message(message: str, asked: list[IntentStage]) -> str:
    """The deciding stage's refusal, naming it, what the stages before it found, and the stages skipped."""
    decided = [facts for facts in asked if facts.outcome != "skipped"]
    if len(decided) > 1:
        earlier = "; ".join(f"{facts.model} {facts.capability!r} at {facts.score}, below {facts.threshold:.3f}"
                            for facts in decided[:-1])
        message = f"{decided[-1].model}: {message} (asked first: {earlier})"
    skipped = "; ".join(f"{facts.model} not asked: calibrated not to decide {facts.language} intents"
                        for facts in asked if facts.outcome == "skipped")
    return f"{message} ({skipped})" if skipped else message


class Stage:
    """One model of the cascade: its embedder, its capability index, its intent cache and its rule.

    ``default`` is the rule used until the registry holds one calibrated for this model (None: the
    stage routes nothing until then); ``threshold`` and ``margin``, when given, override both. ``off``: the
    languages the stored calibration says the model may not decide.
    """

    def __init__(self, embedder: AsyncEmbedder, settings: SemanticSettings, default: MatchRule | None,
                 threshold: float | None = None, margin: float | None = None):
        self.embedder = embedder
        self.index = CapabilityIndex(embedder)
        self.cache: LruCache[np.ndarray] = LruCache(settings.cache_size)
        self._top_k = settings.top_k
        self._default = default
        self._flags = (threshold, margin)
        self.rule, self.source = self._chosen(None)
        self.off: frozenset[str] = frozenset()
        self.decided: dict[Outcome, int] = {"routed": 0, "unmatched": 0, "ambiguous": 0, "skipped": 0}

    @property
    def name(self) -> str:
        return self.embedder.model.name

    def _chosen(self, stored: IntentRule | None) -> tuple[MatchRule | None, RuleSource]:
        source: RuleSource
        if stored is not None:
            base, source = MatchRule(threshold=stored.threshold, margin=stored.margin), "calibrated"
        elif self._default is not None:
            base, source = self._default, "model default"
        else:
            return None, "uncalibrated"
        threshold, margin = self._flags
        if threshold is not None or margin is not None:
            base, source = MatchRule(threshold=base.threshold if threshold is None else threshold,
                                     margin=base.margin if margin is None else margin), "flags"
        return msgspec.structs.replace(base, top_k=self._top_k), source

    def follow_rules(self, rules: dict[str, IntentRule]) -> None:
        """Take up the rule the registry holds for this stage's model (unless fitted for a model of another vector
        size), or fall back when it is deleted."""
        stored = rules.get(self.name)
        calibrated = stored if stored is not None and stored.dimensions == self.embedder.dimensions else None
        self.rule, self.source = self._chosen(calibrated)
        self.off = frozenset(calibrated.off_languages) if calibrated is not None else frozenset()

    async def update(self, wanted: list[CapabilityText]) -> None:
        await self.index.update(wanted)

    async def vector(self, intent: str) -> np.ndarray:
        """The unit vector of ``intent``, from the cache or the model."""
        key = intent_key(intent)
        vector = self.cache.get(key)
        if vector is None:
            vector = (await self.embedder.encode([key]))[0]
            self.cache.put(key, vector)
        return vector

    async def decide(self, intent: str, rule: MatchRule) -> tuple[IntentMatch | IntentRefusal, IntentStage]:
        names, scores = self.index.scores(await self.vector(intent))
        decision = decide(names, scores, rule)
        best = decision.candidates[0] if decision.candidates else None
        runner_up = decision.candidates[1].score if len(decision.candidates) > 1 else None
        outcome: Outcome = "routed" if isinstance(decision, IntentMatch) else OUTCOMES[decision.code]
        self.decided[outcome] += 1
        return decision, IntentStage(model=self.name, outcome=outcome, capability=best.capability if best else None,
                                     score=best.score if best else None, runner_up=runner_up,
                                     threshold=rule.threshold, margin=rule.margin)

    def skipped(self, rule: MatchRule, lang: str) -> IntentStage:
        self.decided["skipped"] += 1
        return IntentStage(model=self.name, outcome="skipped", threshold=rule.threshold, margin=rule.margin,
                           language=lang)

    def stats(self) -> StageStats:
        rule = self.rule
        return StageStats(model=self.name, dimensions=self.embedder.dimensions,
                          threshold=rule.threshold if rule else None, margin=rule.margin if rule else None,
                          rule=self.source, indexed=len(self.index.names), cache_entries=len(self.cache),
                          cache_hits=self.cache.hits, cache_misses=self.cache.misses, decided=dict(self.decided))

    def close(self) -> None:
        self.embedder.close()


class SemanticRouter:
    """The cascade: ``embedder`` (the shipped model) first, then ``operator`` (an operator's model), if any."""

    def __init__(self, mirror: RegistryMirror, embedder: AsyncEmbedder, settings: SemanticSettings,
                 operator: AsyncEmbedder | None = None):
        model = embedder.model
        self.mirror = mirror
        self.settings = settings
        self.stages = [Stage(embedder, settings, MatchRule(threshold=model.threshold, margin=model.margin),
                             settings.threshold, settings.margin)]
        if operator is not None:
            self.stages.append(Stage(operator, settings, None))
        self._described = 0
        self._revision: int | None = None
        self._refreshing = asyncio.Lock()

    @classmethod
    async def create(cls, mirror: RegistryMirror, settings: SemanticSettings) -> SemanticRouter:
        """Load the models (the shipped one from its wheel, an operator's from its directory; both off the
        loop) and index the mirror's capabilities. A model directory that cannot be loaded is a ModelDirError."""
        shipped = await AsyncEmbedder.load(settings.model)
        try:
            operator = None if settings.embed_model is None else \
                await AsyncEmbedder.load_dir(Path(settings.embed_model), settings.embed_prompt)
        except BaseException:
            shipped.close()
            raise
        router = cls(mirror, shipped, settings, operator)
        await router.refresh()
        return router

    @property
    def embedder(self) -> AsyncEmbedder:
        return self.stages[0].embedder

    @property
    def index(self) -> CapabilityIndex:
        return self.stages[0].index

    @property
    def cache(self) -> LruCache[np.ndarray]:
        return self.stages[0].cache

    @property
    def rule(self) -> MatchRule:
        """The first stage's rule (the shipped model's always has one)."""
        rule = self.stages[0].rule
        assert rule is not None
        return rule

    @property
    def active(self) -> bool:
        return self._described <= self.settings.max_capabilities

    async def refresh(self) -> None:
        """Bring the indexes and rules in line with the mirror if the registry changed since the last look."""
        async with self._refreshing:
            revision = self.mirror.revision
            if revision == self._revision:
                return
            wanted = described_capabilities(self.mirror.keys)
            self._described = len(wanted)
            for stage in self.stages:
                await stage.update(wanted if self.active else [])
                stage.follow_rules(self.mirror.keys.intent_rules)  # once a vector told the model's size
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
        decision, first = await self.stages[0].decide(intent, self.rule)
        asked = [first]
        for stage in self.stages[1:]:
            if not asks_next(None if isinstance(decision, IntentMatch) else decision.code, len(decision.candidates)):
                break
            if stage.rule is None:  # an operator's model with no calibrated rule yet is not asked
                continue
            lang = language(intent)
            if lang in stage.off:
                asked.append(stage.skipped(stage.rule, lang))
            else:
                decision, facts = await stage.decide(intent, stage.rule)
                asked.append(facts)
        if isinstance(decision, IntentRefusal) and len(asked) > 1:
            decision = msgspec.structs.replace(decision, message=refusal_message(decision.message, asked))
        return msgspec.structs.replace(decision, stages=asked)

    async def vector(self, intent: str) -> np.ndarray:
        """The unit vector of ``intent`` under the first stage's model, from its cache or the model."""
        return await self.stages[0].vector(intent)

    def stats(self) -> SemanticStats:
        first = self.stages[0]
        return SemanticStats(model=first.name, capabilities=self._described, indexed=len(first.index.names),
                             active=self.active, cache_entries=len(first.cache), cache_hits=first.cache.hits,
                             cache_misses=first.cache.misses, stages=[stage.stats() for stage in self.stages])

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
