"""Would a second signal or another refusal rule route more intents with no wrong route? One command:
`python bench/semantic_signals.py`.

Signals per (intent, capability):

- centroid: the router's score (cosine to the mean of description and examples);
- nearest: the cosine to the capability's closest single text;
- lexical: TF-IDF cosine over words and character trigrams (English) and characters and character
  bigrams (Chinese has no spaces), capabilities as documents (name, description, examples);
- foreign: per capability, the best score any other capability's text gets against it (a threshold
  of its own without labels: a capability that attracts foreign texts needs a higher bar).

Every idea is calibrated with the router's own procedure: its parameters are the ones with the most
correct routes on the calibration half and no wrong route there even with the threshold 0.03 lower
(ties to the stricter rule, then to the smaller weight), and it is reported on the held-out half,
English and Chinese apart. Nothing is chosen on the held-out half, except in the last row, which is
not a rule but a ceiling: the best threshold and margin for the router's score chosen on the
held-out half itself, per language — what no threshold and margin can beat on that score.

Results: two tables on stdout (the ideas; the weighted sums a * centroid + (1 - a) * nearest +
w * lexical) and JSON in bench/results/semantic_signals.json.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import numpy as np

from common import RESULTS, ROOT
from semantic.calibrate import GUARD_STEPS, MARGINS, THRESHOLDS, is_calibration, load_eval_set
from semantic.embedder import AsyncEmbedder
from semantic.index import CapabilityIndex

EVAL = load_eval_set(ROOT / "tests" / "semantic_eval")
HAN_RUN = re.compile(r"[\u3400-\u9fff]+")
WORD = re.compile(r"[a-z0-9]+")
STOP = frozenset(["a", "an", "the", "of", "to", "for", "in", "on", "at", "is", "are", "be", "my", "me", "i", "you",
                  "your", "it", "this", "that", "what", "how", "can", "please", "and", "or", "do", "does", "with",
                  "by", "from", "we", "our", "us"])
CENTROID_SHARES = (1.0, 0.75, 0.5, 0.25)
LEXICAL_WEIGHTS = (0.0, 0.05, 0.1, 0.2)
CHINESE_LEXICAL_WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
OFFSETS = [round(-0.3 + 0.01 * step, 2) for step in range(61)]
RELATIVE_GAPS = [round(0.005 * step, 3) for step in range(81)]
GUARD = round(0.01 * GUARD_STEPS, 2)

LABELS = [intent.label for intent in EVAL.intents]
LANGS = np.array([intent.lang for intent in EVAL.intents])
CALIBRATION = np.array([is_calibration(intent) for intent in EVAL.intents])
CHINESE = LANGS == "zh"
LANGUAGE = {"en": LANGS == "en", "zh": CHINESE}


def features(text: str) -> list[str]:
    """Words and their character trigrams; Chinese characters and character bigrams."""
    folded = text.casefold()
    found = []
    for run in HAN_RUN.findall(folded):
        found += [*run, *(run[i:i + 2] for i in range(len(run) - 1))]
    for word in WORD.findall(folded):
        if word not in STOP:
            padded = f" {word} "
            found += ["w:" + word, *(padded[i:i + 3] for i in range(len(padded) - 2))]
    return found


def weighted(counts: Counter[str], idf: dict[str, float]) -> dict[str, float]:
    vector = {key: (1 + math.log(count)) * idf[key] for key, count in counts.items() if key in idf}
    norm = math.sqrt(sum(value * value for value in vector.values())) or 1.0
    return {key: value / norm for key, value in vector.items()}


def lexical_scores(documents: list[list[str]], intents: list[str]) -> np.ndarray:
    """TF-IDF cosine of every intent to every document (rows: intents)."""
    counts = [Counter(feature for text in texts for feature in features(text)) for texts in documents]
    frequency = Counter(key for document in counts for key in document)
    idf = {key: math.log((len(counts) + 1) / (seen + 0.5)) for key, seen in frequency.items()}
    vectors = [weighted(document, idf) for document in counts]
    scores = np.zeros((len(intents), len(documents)), dtype=np.float32)
    for row, intent in enumerate(intents):
        query = weighted(Counter(features(intent)), idf)
        for column, vector in enumerate(vectors):
            scores[row, column] = sum(value * vector.get(key, 0.0) for key, value in query.items())
    return scores


class Signals(msgspec.Struct, frozen=True):
    names: list[str]
    centroid: np.ndarray
    nearest: np.ndarray
    lexical: np.ndarray
    foreign: np.ndarray


async def signals() -> Signals:
    embedder = await AsyncEmbedder.load()
    texts = EVAL.capability_texts()
    index = CapabilityIndex(embedder)
    await index.update(texts)
    names = index.names
    vectors = await embedder.encode([intent.text for intent in EVAL.intents])
    centroid = np.stack([index.scores(vector)[1] for vector in vectors])
    by_name = {entry.name: entry for entry in texts}
    own = [await embedder.encode(list(by_name[name].texts)) for name in names]
    nearest = np.stack([(vectors @ rows.T).max(axis=1) for rows in own], axis=1)
    foreign = np.array([max(float(index.scores(row)[1][column]) for other, rows in enumerate(own) if other != column
                            for row in rows) for column in range(len(names))])
    documents = [[name.replace(".", " ").replace("_", " "), *by_name[name].texts] for name in names]
    embedder.close()
    return Signals(names, centroid, nearest, lexical_scores(documents, [intent.text for intent in EVAL.intents]),
                   foreign)


class Ranking(msgspec.Struct, frozen=True):
    """Per intent: the best capability's column, its score and the runner-up's; right: the best is the label."""

    best: np.ndarray
    score: np.ndarray
    runner_up: np.ndarray
    right: np.ndarray

    @property
    def gap(self) -> np.ndarray:
        """Rounded as the router rounds the scores it compares."""
        gap: np.ndarray = np.round(self.score - self.runner_up, 4)
        return gap


def ranking(names: list[str], scores: np.ndarray) -> Ranking:
    order = np.argsort(-scores, axis=1, kind="stable")
    rows = np.arange(len(scores))
    best = order[:, 0]
    right = np.array([label is not None and names[column] == label for label, column in zip(LABELS, best, strict=True)])
    return Ranking(best, scores[rows, best], scores[rows, order[:, 1]], right)


# A rule: (ranking, parameters) -> which intents it routes. The first parameter is its threshold.
Rule = Callable[[Ranking, tuple[float, ...]], np.ndarray]


def absolute(ranked: Ranking, params: tuple[float, ...]) -> np.ndarray:
    threshold, margin = params
    return (ranked.score >= threshold) & (ranked.gap >= margin)


def relative(ranked: Ranking, params: tuple[float, ...]) -> np.ndarray:
    """The best ahead of the runner-up by a share of its own score, instead of an absolute margin."""
    threshold, share = params
    routed: np.ndarray = (ranked.score >= threshold) & (ranked.score - ranked.runner_up >= share * ranked.score)
    return routed


def per_language(ranked: Ranking, params: tuple[float, ...]) -> np.ndarray:
    english, chinese, margin = params
    return (ranked.score >= np.where(CHINESE, chinese, english)) & (ranked.gap >= margin)


def per_capability(foreign: np.ndarray) -> Rule:
    """The threshold of the best capability: its foreign score plus ``offset``."""
    def rule(ranked: Ranking, params: tuple[float, ...]) -> np.ndarray:
        offset, margin = params
        routed: np.ndarray = (ranked.score >= foreign[ranked.best] + offset) & (ranked.gap >= margin)
        return routed
    return rule


def counts(ranked: Ranking, routed: np.ndarray, among: np.ndarray) -> tuple[int, int]:
    """(correct, wrong) routes among the intents ``among`` selects."""
    return int(np.sum(routed & ranked.right & among)), int(np.sum(routed & ~ranked.right & among))


def guarded(params: tuple[float, ...], thresholds: int) -> Iterable[tuple[float, ...]]:
    """The parameters with each of the first ``thresholds`` (the thresholds) 0.03 lower."""
    for position in range(thresholds):
        lowered = list(params)
        lowered[position] = round(params[position] - GUARD, 2)
        yield tuple(lowered)


def choose(ranked: Ranking, rule: Rule, grid: Iterable[tuple[float, ...]], among: np.ndarray,
           thresholds: int = 1) -> tuple[float, ...]:
    """The most correct routes among ``among`` with no wrong route there, even with each threshold lower."""
    results = {params: counts(ranked, rule(ranked, params), among) for params in grid}

    def clean(params: tuple[float, ...]) -> bool:
        return all(counts(ranked, rule(ranked, lowered), among)[1] == 0 if lowered not in results
                   else results[lowered][1] == 0 for lowered in (params, *guarded(params, thresholds)))
    return max((params for params, (_, wrong) in results.items() if wrong == 0 and clean(params)),
               key=lambda params: (results[params][0], *params))


def held_out(ranked: Ranking, routed: np.ndarray) -> dict[str, dict[str, float]]:
    result = {}
    for lang in ("en", "zh"):
        among = ~CALIBRATION & LANGUAGE[lang]
        correct, wrong = counts(ranked, routed, among)
        routable = sum(label is not None for label, keep in zip(LABELS, among, strict=True) if keep)
        result[lang] = {"recall": round(correct / routable, 4), "wrong": wrong, "correct": correct,
                        "routable": routable}
    return result


def row(idea: str, params: Sequence[float], ranked: Ranking, routed: np.ndarray) -> dict[str, Any]:
    return {"idea": idea, "parameters": [float(value) for value in params],
            "calibration_correct": counts(ranked, routed, CALIBRATION)[0], **held_out(ranked, routed)}


def calibrated(idea: str, scores: np.ndarray, names: list[str], rule: Rule = absolute,
               grid: Iterable[tuple[float, ...]] | None = None, thresholds: int = 1) -> dict[str, Any]:
    ranked = ranking(names, scores)
    params = choose(ranked, rule, grid if grid is not None else itertools.product(THRESHOLDS, MARGINS),
                    CALIBRATION, thresholds)
    return row(idea, params, ranked, rule(ranked, params))


def agreement_tier(found: Signals, base: tuple[float, ...]) -> dict[str, Any]:
    """The lexical signal as a margin booster only: routed by the shipped rule, or, when the lexical signal's
    best is the embedding's best too, with a smaller margin, its own threshold and a lexical floor."""
    ranked, lexical = ranking(found.names, found.centroid), ranking(found.names, found.lexical)
    agree = lexical.best == ranked.best
    shipped = absolute(ranked, base)

    def tier(candidate: Ranking, params: tuple[float, ...]) -> np.ndarray:
        threshold, margin, floor = params
        routed: np.ndarray = shipped | (agree & absolute(candidate, (threshold, margin)) & (lexical.score >= floor))
        return routed
    grid = itertools.product(THRESHOLDS[25:60], [round(0.01 * step, 2) for step in range(21)],
                             [round(0.05 * step, 2) for step in range(14)])
    params = choose(ranked, tier, grid, CALIBRATION)
    return row("lexical agreement lowers the margin", params, ranked, tier(ranked, params))


def chinese_lexical(found: Signals) -> dict[str, Any]:
    """Character n-grams for Chinese intents only, their weight chosen on the calibration half too."""
    best: tuple[tuple[int, float], dict[str, Any]] | None = None
    for weight in CHINESE_LEXICAL_WEIGHTS:
        result = calibrated(f"+ {weight} x lexical, Chinese intents only",
                            found.centroid + weight * found.lexical * CHINESE[:, None], found.names)
        key = (result["calibration_correct"], -weight)
        if best is None or key > best[0]:
            best = (key, result)
    assert best is not None
    chosen = best[1]
    return {**chosen, "idea": f"lexical for Chinese intents only (weight chosen: {chosen['idea'].split()[1]})"}


def language_by_language(found: Signals, idea: str, half: np.ndarray, guarded_params: int) -> dict[str, Any]:
    """Each language's own threshold and margin, chosen on its intents in ``half``."""
    ranked = ranking(found.names, found.centroid)
    routed = np.zeros(len(LABELS), dtype=bool)
    chosen: list[float] = []
    for lang in ("en", "zh"):
        params = choose(ranked, absolute, itertools.product(THRESHOLDS, MARGINS), half & LANGUAGE[lang],
                        guarded_params)
        routed |= absolute(ranked, params) & LANGUAGE[lang]
        chosen += params
    return row(idea, chosen, ranked, routed)


def ideas(found: Signals) -> list[dict[str, Any]]:
    names = found.names
    shipped = calibrated("centroid, threshold + margin (shipped)", found.centroid, names)
    return [
        shipped,
        calibrated("nearest single text", found.nearest, names),
        calibrated("max(centroid, nearest)", np.maximum(found.centroid, found.nearest), names),
        calibrated("per-language thresholds, one margin", found.centroid, names, per_language,
                   itertools.product(THRESHOLDS[40:70], THRESHOLDS[30:70], MARGINS[:30]), thresholds=2),
        calibrated("per-capability threshold: its foreign score + offset", found.centroid, names,
                   per_capability(found.foreign), itertools.product(OFFSETS, MARGINS)),
        calibrated("relative margin: best - runner-up >= share x best", found.centroid, names, relative,
                   itertools.product(THRESHOLDS, RELATIVE_GAPS)),
        agreement_tier(found, tuple(shipped["parameters"])),
        chinese_lexical(found),
        language_by_language(found, "per-language threshold and margin, each guarded by 0.03",
                             CALIBRATION, 2),
        language_by_language(found, "ceiling: threshold and margin chosen on the held-out half (not a rule)",
                             ~CALIBRATION, 0),
    ]


def weighted_sums(found: Signals) -> list[dict[str, Any]]:
    rows = []
    for share, weight in itertools.product(CENTROID_SHARES, LEXICAL_WEIGHTS):
        scores = share * found.centroid + (1 - share) * found.nearest + weight * found.lexical
        rows.append({"centroid_share": share, "lexical_weight": weight,
                     **calibrated(f"a={share}, w={weight}", scores, found.names)})
    return rows


def cells(result: dict[str, Any]) -> str:
    return " | ".join(f"{result[lang]['recall']:.3f} ({result[lang]['correct']}/{result[lang]['routable']}) / "
                      f"{result[lang]['wrong']}" for lang in ("en", "zh"))


def main() -> None:
    found = asyncio.run(signals())
    studied, sums = ideas(found), weighted_sums(found)
    print("| idea | parameters (calibration half) | calibration correct | held-out English recall / wrong | "
          "held-out Chinese recall / wrong |")
    print("|---|---|---:|---:|---:|")
    for result in studied:
        print(f"| {result['idea']} | {', '.join(f'{value:g}' for value in result['parameters'])} | "
              f"{result['calibration_correct']} | {cells(result)} |")
    chosen = max(sums, key=lambda result: (result["calibration_correct"], result["centroid_share"],
                                           -result["lexical_weight"]))
    print()
    print("score = a * centroid + (1 - a) * nearest + w * lexical, each calibrated on the calibration half; "
          f"the calibration half prefers a={chosen['centroid_share']}, w={chosen['lexical_weight']}")
    print("| centroid share a | lexical weight w | threshold | margin | calibration correct | "
          "held-out English recall / wrong | held-out Chinese recall / wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for result in sums:
        threshold, margin = result["parameters"]
        print(f"| {result['centroid_share']} | {result['lexical_weight']} | {threshold:g} | {margin:g} | "
              f"{result['calibration_correct']} | {cells(result)} |")
    path = RESULTS / "semantic_signals.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ideas": studied, "weighted_sums": sums}, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
