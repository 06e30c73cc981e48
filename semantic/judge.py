"""Whether a learned example may join the index: it must send no labelled phrasing astray.

The labelled phrasings are the mesh's own (every offered capability's declared examples and its
accepted learned ones, each labelled with its capability) and, when the operator gives the registry
one, an evaluation set (an intents.json as in tests/semantic_eval: texts labelled with the capability
that should serve them, or null for none). The mesh's own phrasings speak about the capabilities
actually registered; only an evaluation set holds phrasings that must route nowhere, the near misses
a learned example pulls over the threshold (on tests/semantic_eval, an accepted order.qps phrasing
sends "what is the QPS of the search service" to order.qps). An intent labelled with a capability
no instance offers is one that must route nowhere here.

A phrasing counts against the example only if it routes to a wrong capability with the example and
did not without it; the example itself, if it would still route to another capability (a refusal
is never wrong).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np

from mesh.examples import HeardRule, phrasing
from mesh.keyspace import KeySpace
from semantic.cache import LruCache, intent_key
from semantic.embedder import AsyncEmbedder
from semantic.index import CapabilityIndex, CapabilityText, capability_text, described_capabilities
from semantic.language import language
from semantic.matcher import MatchRule, cascade_routed_to

# (text, the capability that should serve it, or None for none).
Labelled = tuple[str, str | None]


def labelled_phrasings(keys: KeySpace) -> list[tuple[str, str]]:
    """(text, capability) for every declared example and accepted learned example of an offered capability."""
    found: dict[str, tuple[str, str]] = {}
    for name, offers in keys.offers.items():
        learned = [e.text for e in keys.examples.get(name, {}).values() if e.state == "accepted"]
        for text in [*(example for offered in offers.values() for example in offered.examples), *learned]:
            found.setdefault(phrasing(text), (text, name))
    return sorted(found.values())


def with_example(capabilities: list[CapabilityText], capability: str, text: str) -> list[CapabilityText]:
    """The index's capabilities with ``text`` among ``capability``'s learned examples."""
    others = [entry for entry in capabilities if entry.name != capability]
    own = next((entry for entry in capabilities if entry.name == capability), CapabilityText(capability, ()))
    return [*others, capability_text(capability, own.texts, (*own.learned, text))]


class _Model:
    """One model the judge scores with: its index before and after the example, and its phrasings' vectors."""

    def __init__(self, embedder: AsyncEmbedder, index: Callable[[AsyncEmbedder], CapabilityIndex]):
        self.embedder = embedder
        self.before, self.after = index(embedder), index(embedder)
        self._vectors: LruCache[np.ndarray] = LruCache(10_000)

    async def update(self, capabilities: list[CapabilityText], capability: str, text: str) -> None:
        await self.before.update(capabilities)
        await self.after.update(with_example(capabilities, capability, text))

    async def vector(self, text: str) -> np.ndarray:
        key = intent_key(text)
        vector = self._vectors.get(key)
        if vector is None:
            vector = (await self.embedder.encode([key]))[0]
            self._vectors.put(key, vector)
        return vector


class ExampleJudge:
    """Loads the default model on first use (the registry rarely judges; most never need it).

    ``index`` builds the index it scores with: the router's, unless a benchmark measures another scoring,
    which its judge must then use too (an example is judged by the scores it would route with).
    ``operator``: an operator's model (``--embed-model``) that routers ask after the shipped one; an example
    is then judged by where the cascade would send each phrasing, with the rule the registry holds for
    that model (none yet: routers do not ask it, and neither does the judge) and not for a phrasing in a
    language that rule keeps the model off.
    """

    def __init__(self, embedder: AsyncEmbedder | None = None, rule: MatchRule | None = None,
                 evaluation: Sequence[Labelled] = (),
                 index: Callable[[AsyncEmbedder], CapabilityIndex] = CapabilityIndex,
                 operator: AsyncEmbedder | None = None):
        self._embedder = embedder
        self._evaluation = list(evaluation)
        self._rule = rule
        self._index = index
        self._loading = asyncio.Lock()
        self._models: list[_Model] = []
        self._operator = None if operator is None else _Model(operator, index)

    async def _ready(self) -> tuple[MatchRule, list[_Model]]:
        async with self._loading:
            if self._embedder is None:
                self._embedder = await AsyncEmbedder.load()
            if self._rule is None:
                model = self._embedder.model
                self._rule = MatchRule(threshold=model.threshold, margin=model.margin)
            if not self._models:
                self._models = [_Model(self._embedder, self._index)]
            return self._rule, self._models

    def _operator_rule(self, keys: KeySpace, top_k: int) -> tuple[MatchRule, frozenset[str]] | None:
        """The operator model's stored rule and the languages it is off for, as routers take them up."""
        operator = self._operator
        stored = keys.intent_rules.get(operator.embedder.model.name) if operator is not None else None
        if operator is None or stored is None or stored.dimensions != operator.embedder.dimensions:
            return None
        return MatchRule(threshold=stored.threshold, margin=stored.margin, top_k=top_k), frozenset(stored.off_languages)

    async def __call__(self, keys: KeySpace, capability: str, text: str, heard: HeardRule | None = None) -> str | None:
        """Why accepting ``text`` as an example of ``capability`` would route something wrongly, or None.

        Checked with ``heard``, the routers' loosest threshold and margin, when they reported one; else with
        the rule this judge was given, or the model's calibrated one.
        """
        if capability not in keys.offers:
            return (f"No instance offers {capability!r} now: an example is checked against the capabilities "
                    "it would compete with, so it can be accepted only while one does")
        labelled: list[Labelled] = [*labelled_phrasings(keys), *self._evaluation]
        for other_text, label in labelled:
            if label != capability and phrasing(other_text) == phrasing(text):
                return f"{text!r} is labelled {label!r}" if label else f"{text!r} is labelled to route nowhere"
        rule, shipped = await self._ready()
        if heard is not None:
            rule = MatchRule(threshold=heard.threshold, margin=heard.margin, top_k=rule.top_k)
        stages = [(shipped[0], rule, frozenset[str]())]
        operator_rule = self._operator_rule(keys, rule.top_k)
        if self._operator is not None and operator_rule is not None:
            stages.append((self._operator, *operator_rule))
        capabilities = described_capabilities(keys)
        for model, _, _ in stages:
            await model.update(capabilities, capability, text)

        async def sent(phrase: str, after: bool) -> str | None:
            lang = language(phrase)
            return cascade_routed_to([(*(model.after if after else model.before).scores(await model.vector(phrase)),
                                       stage_rule) for model, stage_rule, off in stages if lang not in off])

        routed = await sent(text, after=True)
        if routed is not None and routed != capability:
            return f"even with it, {text!r} would be routed to {routed!r}"
        for intent, label in labelled:
            routed = await sent(intent, after=True)
            if routed is not None and routed != label and routed != await sent(intent, after=False):
                meant = f"labelled {label!r}" if label else "labelled to route nowhere"
                return f"with it, {intent!r} ({meant}) would be routed to {routed!r}"
        return None

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
        if self._operator is not None:
            self._operator.embedder.close()
