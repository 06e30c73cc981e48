"""Pick threshold and margin from labelled intents: zero wrong routes first, then the most recall; and the
languages a model reads well enough to decide at all (``LanguageGate``).

The evaluation set (tests/semantic_eval) is split in two halves by a hash of each intent's text:
the defaults are chosen on the calibration half and reported on the held-out half too, so they
are not tuned to the very sentences that judge them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from semantic.embedder import AsyncEmbedder
from semantic.index import CapabilityIndex, CapabilityText, capability_text
from semantic.language import HAN, language
from semantic.matcher import MatchRule, top_candidates, verdict

THRESHOLDS = [round(0.01 * step, 2) for step in range(101)]
MARGINS = [round(0.005 * step, 3) for step in range(61)]
GUARD_STEPS = 3


class EvalCapability(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str = ""
    examples: list[str] = []


class _IntentGroup(msgspec.Struct, forbid_unknown_fields=True):
    label: str | None
    lang: str
    texts: list[str]


class LabelledIntent(msgspec.Struct, frozen=True):
    text: str
    label: str | None
    lang: str


class EvalSet(msgspec.Struct):
    capabilities: list[EvalCapability]
    intents: list[LabelledIntent]

    def capability_texts(self) -> list[CapabilityText]:
        return [capability_text(c.name, (c.description, *c.examples)) for c in self.capabilities]

    def english_descriptions(self) -> EvalSet:
        """The set as if every capability were described in English only.

        Chinese descriptions and examples are dropped; a capability left with no text, and the
        intents labelled with it, are dropped too.
        """
        kept = [EvalCapability(c.name, "" if HAN.search(c.description) else c.description,
                               [e for e in c.examples if not HAN.search(e)]) for c in self.capabilities]
        kept = [c for c in kept if c.description or c.examples]
        names = {c.name for c in kept}
        return EvalSet(kept, [i for i in self.intents if i.label is None or i.label in names])


def load_labelled_intents(path: Path) -> list[LabelledIntent]:
    """An intents.json: groups of texts, each with the capability that should serve them (null: none)."""
    groups = msgspec.json.decode(path.read_bytes(), type=list[_IntentGroup])
    return [LabelledIntent(text, g.label, g.lang) for g in groups for text in g.texts]


def load_eval_set(directory: Path) -> EvalSet:
    """capabilities.json (name, description, examples) and intents.json (groups of texts with a label)."""
    capabilities = msgspec.json.decode((directory / "capabilities.json").read_bytes(), type=list[EvalCapability])
    intents = load_labelled_intents(directory / "intents.json")
    known = {c.name for c in capabilities}
    unknown = {i.label for i in intents if i.label is not None and i.label not in known}
    if unknown:
        raise ValueError(f"intents labelled with capabilities the set does not have: {sorted(unknown)}")
    return EvalSet(capabilities, intents)


def is_calibration(intent: LabelledIntent) -> bool:
    """Deterministic half of the set, independent of file order."""
    return hashlib.blake2b(intent.text.encode(), digest_size=1).digest()[0] % 2 == 0


class Ranked(msgspec.Struct, frozen=True):
    """An intent with what a decision looks at: the best score, the runner-up's, the candidates shown."""

    intent: LabelledIntent
    best: str
    score: float
    runner_up: float | None
    candidates: tuple[str, ...]


async def rank(embedder: AsyncEmbedder, index: CapabilityIndex, intents: list[LabelledIntent],
               top_k: int = 3) -> list[Ranked]:
    vectors = await embedder.encode([intent.text for intent in intents])
    ranked = []
    for intent, vector in zip(intents, vectors, strict=True):
        names, scores = index.scores(vector)
        shown = top_candidates(names, scores, max(top_k, 2))
        ranked.append(Ranked(intent, shown[0].capability, shown[0].score, shown[1].score if len(shown) > 1 else None,
                             tuple(candidate.capability for candidate in shown[:top_k])))
    return ranked


class Accuracy(msgspec.Struct, kw_only=True):
    intents: int
    routable: int
    routed: int = 0
    correct: int = 0
    wrong: int = 0
    refused_routable: int = 0
    refused_unroutable: int = 0
    # Refused, but the right capability was among the candidates the refusal lists.
    refused_listed: int = 0
    # Routable intents whose right capability scores best, whatever the rule decides.
    ranked_first: int = 0

    @property
    def precision(self) -> float:
        return self.correct / self.routed if self.routed else 1.0

    @property
    def recall(self) -> float:
        return self.correct / self.routable if self.routable else 0.0


def accuracy(ranked: list[Ranked], rule: MatchRule) -> Accuracy:
    result = Accuracy(intents=len(ranked), routable=sum(item.intent.label is not None for item in ranked))
    for item in ranked:
        label = item.intent.label
        result.ranked_first += label is not None and item.best == label
        if verdict(item.score, item.runner_up, rule) is None:
            result.routed += 1
            if item.best == label:
                result.correct += 1
            else:
                result.wrong += 1
        elif label is None:
            result.refused_unroutable += 1
        else:
            result.refused_routable += 1
            result.refused_listed += label in item.candidates
    return result


def calibrate(ranked: list[Ranked], guard_steps: int = GUARD_STEPS, top_k: int = 3) -> MatchRule:
    """The most correct routes among rules with no wrong route even with the threshold ``guard_steps`` lower.

    Ties go to the stricter rule. Without the guard band, the rule chosen on either half of the
    evaluation set let a near miss of the other half through (as "what is the QPS of the search
    service" to order.qps); with 0.03 it is clean both ways: a rule clean only at its very edge
    is one unseen sentence away from a wrong route.
    """
    results = {(i, j): accuracy(ranked, MatchRule(threshold=threshold, margin=margin, top_k=top_k))
               for i, threshold in enumerate(THRESHOLDS) for j, margin in enumerate(MARGINS)}
    best = max((result.correct, THRESHOLDS[i], MARGINS[j]) for (i, j), result in results.items()
               if results[(max(i - guard_steps, 0), j)].wrong == 0)
    return MatchRule(threshold=best[1], margin=best[2], top_k=top_k)


def load_intents_jsonl(path: Path) -> list[LabelledIntent]:
    """An operator's labelled intents, one JSON object a line: {"text", "label" (null: none), "lang"}."""
    decoder = msgspec.json.Decoder(LabelledIntent)
    intents = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if line.strip():
            try:
                intents.append(decoder.decode(line))
            except msgspec.ValidationError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    return intents


class LanguageFigures(msgspec.Struct, kw_only=True):
    routable: int
    correct: int
    wrong: int
    recall: float


class NearMiss(msgspec.Struct, kw_only=True):
    """A no-match intent: how far its best score stays below the stored threshold (negative: above it, and
    then only the margin, ``gap`` to the runner-up, keeps it from routing)."""

    text: str
    best: str
    score: float
    below_threshold: float
    gap: float | None


class LanguageGate(msgspec.Struct, kw_only=True):
    """Whether the model may decide intents of one language (semantic/language.py tells them apart).

    Only where it ranks the right capability first for more than half of the language's routable intents, on
    each half of the set (``halves``; ``decides``: both). Below that its scores in the language mean too little
    for any threshold to keep wrong routes out (all-MiniLM-L6-v2, English-only, ranks 13 of 67 Chinese intents
    right and 217 of 241 English ones); the count needs no threshold, so each half's verdict stands unfitted
    on the other.
    """

    routable: tuple[int, int]
    ranked_first: tuple[int, int]
    halves: tuple[bool, bool]
    decides: bool


def reads(routable: int, ranked_first: int) -> bool:
    """Right first more often than not: a model that is not guesses in the language."""
    return ranked_first * 2 > routable


def _ranked_first(ranked: list[Ranked], lang: str) -> tuple[int, int]:
    """(routable, ranked first) among ``ranked``'s intents written in ``lang``."""
    own = [item for item in ranked if item.intent.label is not None and language(item.intent.text) == lang]
    return len(own), sum(item.best == item.intent.label for item in own)


def language_gates(first: list[Ranked], second: list[Ranked]) -> dict[str, LanguageGate]:
    """Each language with a routable intent in either half, judged on each half (a half without one: off)."""
    gates: dict[str, LanguageGate] = {}
    for lang in sorted({language(item.intent.text) for item in (*first, *second) if item.intent.label is not None}):
        counts = (_ranked_first(first, lang), _ranked_first(second, lang))
        halves = (reads(*counts[0]), reads(*counts[1]))
        gates[lang] = LanguageGate(routable=(counts[0][0], counts[1][0]), ranked_first=(counts[0][1], counts[1][1]),
                                   halves=halves, decides=all(halves))
    return gates


def off_languages(languages: dict[str, LanguageGate], half: int | None = None) -> frozenset[str]:
    """The languages the model may not decide: as stored (``half`` None), or as half 0 or 1 alone judged."""
    return frozenset(lang for lang, gate in languages.items()
                     if not (gate.decides if half is None else gate.halves[half]))


def decided_by(rule: MatchRule, off: frozenset[str], intent: LabelledIntent) -> MatchRule | None:
    """The rule a stage decides ``intent`` with, or None when its language is off for the stage."""
    return None if language(intent.text) in off else rule


class CrossFit(msgspec.Struct, kw_only=True):
    """Rules fitted on each half and judged on the other, and the rule to store: the stricter of the two.

    Each half's rule routes nothing wrongly on its half (even with the guard band), and a stricter rule
    routes a subset of what either does, so the stored one is clean on the whole set; how each half's
    rule did on the half it never saw is what an unseen intent can expect. Likewise each language's gate:
    a half's verdict is applied to the other half's intents, and the stored one is on only where both are.
    """

    rule: MatchRule
    halves: tuple[MatchRule, MatchRule]
    guard: float
    languages: dict[str, LanguageGate]
    held_out: dict[str, LanguageFigures]
    fitted: dict[str, LanguageFigures]
    near_misses: list[NearMiss]


def _by_language(pairs: list[tuple[Ranked, MatchRule | None]]) -> dict[str, LanguageFigures]:
    """Recall and wrong routes per labelled language, each intent judged with its rule (None: not decided)."""
    figures: dict[str, LanguageFigures] = {}
    for lang in sorted({item.intent.lang for item, _ in pairs}):
        routable = correct = wrong = 0
        for item, rule in pairs:
            if item.intent.lang != lang:
                continue
            routable += item.intent.label is not None
            if rule is not None and verdict(item.score, item.runner_up, rule) is None:
                correct += item.best == item.intent.label
                wrong += item.best != item.intent.label
        figures[lang] = LanguageFigures(routable=routable, correct=correct, wrong=wrong,
                                        recall=round(correct / routable, 4) if routable else 0.0)
    return figures


def cross_fit(ranked: list[Ranked], guard_steps: int = GUARD_STEPS, top_k: int = 3, near_misses: int = 5) -> CrossFit:
    """Fit on each half (``calibrate``, ``language_gates``), judge each on the other, store the stricter; see
    CrossFit."""
    first = [item for item in ranked if is_calibration(item.intent)]
    second = [item for item in ranked if not is_calibration(item.intent)]
    if not first or not second:
        raise ValueError("too few labelled intents: both halves of the set need some (at least a few dozen)")
    fits = (calibrate(first, guard_steps, top_k), calibrate(second, guard_steps, top_k))
    rule = MatchRule(threshold=max(fit.threshold for fit in fits), margin=max(fit.margin for fit in fits), top_k=top_k)
    languages = language_gates(first, second)
    off = (off_languages(languages, 0), off_languages(languages, 1))
    stored = off_languages(languages)
    unrouted = sorted((item for item in ranked if item.intent.label is None), key=lambda item: -item.score)
    return CrossFit(
        rule=rule, halves=fits, guard=round(guard_steps * (THRESHOLDS[1] - THRESHOLDS[0]), 4), languages=languages,
        held_out=_by_language([(item, decided_by(fits[1], off[1], item.intent)) for item in first]
                              + [(item, decided_by(fits[0], off[0], item.intent)) for item in second]),
        fitted=_by_language([(item, decided_by(rule, stored, item.intent)) for item in ranked]),
        near_misses=[NearMiss(text=item.intent.text, best=item.best, score=item.score,
                              below_threshold=round(rule.threshold - item.score, 4),
                              gap=None if item.runner_up is None else round(item.score - item.runner_up, 4))
                     for item in unrouted[:near_misses]])
