"""Would a second signal beside the embedding route more intents with no wrong route? One command:
`python bench/semantic_signals.py`.

Signals per (intent, capability), each calibrated with the router's own procedure (threshold and
margin on the calibration half, zero wrong routes with the 0.03 guard band) and reported on the
held-out half, English and Chinese apart:

- centroid: the router's score (cosine to the mean of description and examples);
- nearest: the cosine to the capability's closest single text;
- lexical: TF-IDF cosine over words and character trigrams (English) and characters and character
  bigrams (Chinese has no spaces), capabilities as documents (name, description, examples).

score = a * centroid + (1 - a) * nearest + w * lexical, for a grid of a and w. The router ships
the combination that wins here; on tests/semantic_eval that is the centroid alone (a=1, w=0).
Results: a table on stdout and JSON in bench/results/semantic_signals.json.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from typing import Any

import numpy as np

from common import RESULTS, ROOT
from router.semantic.calibrate import Ranked, accuracy, calibrate, is_calibration, load_eval_set
from router.semantic.embedder import AsyncEmbedder
from router.semantic.index import CapabilityIndex
from router.semantic.matcher import top_candidates

EVAL = load_eval_set(ROOT / "tests" / "semantic_eval")
HAN_RUN = re.compile(r"[\u3400-\u9fff]+")
WORD = re.compile(r"[a-z0-9]+")
STOP = frozenset(["a", "an", "the", "of", "to", "for", "in", "on", "at", "is", "are", "be", "my", "me", "i", "you",
                  "your", "it", "this", "that", "what", "how", "can", "please", "and", "or", "do", "does", "with",
                  "by", "from", "we", "our", "us"])
CENTROID_SHARES = (1.0, 0.75, 0.5, 0.25)
LEXICAL_WEIGHTS = (0.0, 0.05, 0.1, 0.2)


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


def ranked_by(names: list[str], scores: np.ndarray) -> list[Ranked]:
    ranked = []
    for intent, row in zip(EVAL.intents, scores, strict=True):
        shown = top_candidates(names, row, 3)
        ranked.append(Ranked(intent, shown[0].capability, shown[0].score, shown[1].score,
                             tuple(candidate.capability for candidate in shown)))
    return ranked


async def signals() -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    embedder = await AsyncEmbedder.load()
    texts = EVAL.capability_texts()
    index = CapabilityIndex(embedder)
    await index.update(texts)
    names = index.names
    vectors = await embedder.encode([intent.text for intent in EVAL.intents])
    centroid = np.stack([index.scores(vector)[1] for vector in vectors])
    by_name = {entry.name: entry for entry in texts}
    nearest = np.stack([(vectors @ (await embedder.encode(list(by_name[name].texts))).T).max(axis=1)
                        for name in names], axis=1)
    documents = [[name.replace(".", " ").replace("_", " "), *by_name[name].texts] for name in names]
    embedder.close()
    return names, centroid, nearest, lexical_scores(documents, [intent.text for intent in EVAL.intents])


def study(names: list[str], centroid: np.ndarray, nearest: np.ndarray, lexical: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for share in CENTROID_SHARES:
        for weight in LEXICAL_WEIGHTS:
            ranked = ranked_by(names, share * centroid + (1 - share) * nearest + weight * lexical)
            held_out = [item for item in ranked if not is_calibration(item.intent)]
            rule = calibrate([item for item in ranked if is_calibration(item.intent)])
            row: dict[str, Any] = {"centroid_share": share, "lexical_weight": weight, "threshold": rule.threshold,
                                   "margin": rule.margin}
            for lang in ("en", "zh"):
                result = accuracy([item for item in held_out if item.intent.lang == lang], rule)
                row[lang] = {"recall": round(result.recall, 4), "wrong": result.wrong}
            rows.append(row)
    return rows


def main() -> None:
    rows = study(*asyncio.run(signals()))
    print("| centroid share a | lexical weight w | threshold | margin | held-out English recall / wrong | "
          "held-out Chinese recall / wrong |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['centroid_share']} | {row['lexical_weight']} | {row['threshold']} | {row['margin']} | "
              f"{row['en']['recall']:.3f} / {row['en']['wrong']} | {row['zh']['recall']:.3f} / {row['zh']['wrong']} |")
    path = RESULTS / "semantic_signals.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
