"""`agentreach intents calibrate --model DIR --set FILE.jsonl`: fit a model's threshold and margin, store them.

Cosine scores differ per model, so an operator's model routes nothing until a rule is fitted for it on
the operator's own capabilities and labelled intents (``--set``: one {"text", "label", "lang"} a line,
label null for an intent that must route nowhere). The rule (semantic/calibrate.py ``cross_fit``), with
the languages the model may not decide (it does not read them), is stored in the registry under the
model's name (mesh/intent_rules.py), where every router running the model picks it up; `--dry-run` only
reports. The capabilities are the registry's live ones (their declared descriptions and examples), or a
capabilities.json (tests/semantic_eval's layout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from agentreach.admin import Call, CommandFailed, add_key_flags, send
from agentreach.credentials import admin_key, default_registry
from mesh.intent_rules import IntentRule, LanguageReport
from semantic.settings import SemanticUnavailable


def add_command(commands: Any) -> None:
    intents = commands.add_parser(
        "intents",
        help="calibrate semantic matching for an embedding model",
        description="Semantic matching's rules per embedding model.",
    )
    actions = intents.add_subparsers(dest="action", required=True, metavar="ACTION")
    calibrate = actions.add_parser(
        "calibrate",
        help="fit a model's threshold and margin on labelled intents and store them in the registry",
        description="Fit the threshold and margin on each half of the labelled intents, report each on the half it "
        "did not see (recall and wrong routes per language, the nearest no-match intents), and store "
        "the stricter of the two for the model, with the languages it may decide (those it ranks the right "
        "capability first for more than half of the intents of, on each half): every router running it routes "
        "with them.",
    )
    calibrate.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="the model's directory, as given to --embed-model (or a shipped model's name)",
    )
    calibrate.add_argument(
        "--set",
        required=True,
        type=Path,
        metavar="FILE.jsonl",
        dest="intents",
        help='labelled intents, one JSON object a line: {"text", "label", "lang"}',
    )
    calibrate.add_argument(
        "--capabilities",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="the capabilities to match against, as tests/semantic_eval/capabilities.json "
        "(default: the registry's live capabilities)",
    )
    calibrate.add_argument("--prompt", default="", metavar="TEXT", help="the model's --embed-prompt, if it has one")
    calibrate.add_argument(
        "--guard",
        type=int,
        default=3,
        metavar="STEPS",
        help="no wrong route even with the threshold this many 0.01 steps lower (default: 3)",
    )
    calibrate.add_argument("--dry-run", action="store_true", help="report only; store nothing")
    calibrate.add_argument(
        "--registry",
        default=default_registry(),
        metavar="URL",
        help="the registry (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)",
    )
    add_key_flags(calibrate)


async def _capability_texts(args: argparse.Namespace, key: str | None) -> list[Any]:
    from semantic.calibrate import EvalCapability
    from semantic.index import capability_text

    if args.capabilities is not None:
        try:
            listed = msgspec.json.decode(args.capabilities.read_bytes(), type=list[EvalCapability])
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise CommandFailed(f"--capabilities {args.capabilities}: {exc}", 2) from None
        return [capability_text(c.name, (c.description, *c.examples)) for c in listed]
    agents = (await send(args.registry, key or "", Call("GET", "/agents")))["agents"]
    texts: dict[str, list[str]] = {}
    for agent in agents:
        if agent.get("evicted_at") is None:
            for capability in agent["capabilities"]:
                texts.setdefault(capability["name"], []).extend(
                    [capability.get("description", ""), *capability.get("examples", [])]
                )
    # As a router indexes them: the declarations and the accepted learned examples (semantic/index.py).
    entries = []
    for name, found in sorted(texts.items()):
        examples = await send(args.registry, key or "", Call("GET", f"/examples/{quote(name, safe='')}"))
        entry = capability_text(name, found, [e["text"] for e in examples if e["state"] == "accepted"])
        if entry.every_text:
            entries.append(entry)
    return entries


async def _calibrate(args: argparse.Namespace, key: str | None) -> dict[str, Any]:
    from semantic.calibrate import cross_fit, load_intents_jsonl, off_languages, rank
    from semantic.embedder import MODELS, AsyncEmbedder
    from semantic.index import CapabilityIndex

    try:
        intents = load_intents_jsonl(args.intents)
    except (OSError, ValueError) as exc:
        raise CommandFailed(f"--set {args.intents}: {exc}", 2) from None
    capabilities = await _capability_texts(args, key)
    if not capabilities:
        raise CommandFailed("no capability to calibrate against: none is registered (or --capabilities is empty)")
    known = {entry.name for entry in capabilities}
    unknown = sorted({i.label for i in intents if i.label is not None and i.label not in known})
    if unknown:
        raise CommandFailed(f"--set {args.intents}: labelled with capabilities that are not there: {unknown}", 2)
    # A directory first: one named like a shipped model is still the operator's.
    shipped = args.model in MODELS and not await asyncio.to_thread(Path(args.model).is_dir)
    embedder = await (
        AsyncEmbedder.load(args.model) if shipped else AsyncEmbedder.load_dir(Path(args.model), args.prompt)
    )
    try:
        index = CapabilityIndex(embedder)
        await index.update(capabilities)
        fit = cross_fit(await rank(embedder, index, intents), args.guard)
    finally:
        embedder.close()
    model = embedder.model.name
    assert embedder.dimensions is not None
    rule = IntentRule(
        threshold=fit.rule.threshold,
        margin=fit.rule.margin,
        dimensions=embedder.dimensions,
        guard=fit.guard,
        intents=len(intents),
        calibrated_at=round(time.time(), 3),
        held_out={
            lang: LanguageReport(routable=f.routable, correct=f.correct, wrong=f.wrong, recall=f.recall)
            for lang, f in fit.held_out.items()
        },
        off_languages=sorted(off_languages(fit.languages)),
    )
    report: dict[str, Any] = {
        "model": model,
        "capabilities": len(capabilities),
        **msgspec.to_builtins(fit),
        "stored": False,
    }
    if not args.dry_run:
        await send(
            args.registry, key or "", Call("PUT", f"/intent-rules/{quote(model, safe='')}", msgspec.to_builtins(rule))
        )
        report["stored"] = True
    return report


def _summary(report: dict[str, Any]) -> str:
    rule = report["rule"]
    lines = [
        f"{report['model']}: threshold {rule['threshold']}, margin {rule['margin']} (guard {report['guard']}; "
        f"{'stored in the registry' if report['stored'] else 'not stored: --dry-run'})",
        "held out (each half's rule on the half it did not see):",
    ]
    lines += [
        f"  {lang}: recall {f['recall']:.3f} ({f['correct']}/{f['routable']}), {f['wrong']} wrong"
        for lang, f in report["held_out"].items()
    ]
    lines.append("languages it may decide (the right capability ranked first for more than half of each half's):")
    for lang, gate in report["languages"].items():
        halves = ", ".join(f"{a}/{n}" for a, n in zip(gate["ranked_first"], gate["routable"], strict=True))
        lines.append(f"  {lang}: {'on' if gate['decides'] else 'off'} ({halves})")
    lines.append("nearest no-match intents (distance below the threshold; above it, the gap to the runner-up):")
    lines += [
        f"  {miss['below_threshold']:+.3f}  {miss['text']!r} (best {miss['best']} at {miss['score']:.3f}"
        + (f", gap {miss['gap']:.3f} < margin {rule['margin']})" if miss["below_threshold"] < 0 else ")")
        for miss in report["near_misses"]
    ]
    wrong = sum(f["wrong"] for f in report["held_out"].values())
    if wrong:
        lines.append(
            f"WARNING: {wrong} held-out intents were routed wrongly by the half that had not seen them: "
            "add near misses like them to the set, or raise --guard"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.guard < 0:
        parser.error("--guard must be 0 or more")
    key = admin_key(args.admin_key, args.data_dir)
    try:
        report = asyncio.run(_calibrate(args, key))
    except (CommandFailed, SemanticUnavailable) as failure:
        print(f"agentreach: {failure}", file=sys.stderr)
        return failure.code if isinstance(failure, CommandFailed) else 2
    print(_summary(report), file=sys.stderr)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0
