"""An operator's own embedding model (`--embed-model DIR`): the real all-MiniLM-L6-v2 from its PyPI wheel.

Loaded through the router as an operator would start it; its vectors checked against the scores the
model's own publisher reports, so the numpy forward pass is the model and not an approximation of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from agent_reach.atp import ErrorCode

from conftest import loop_turns_during
from embed_model_support import EVAL, MODEL_NAME, PUBLISHED, eval_mirror, store_rule
from mesh.intent_rules import IntentRule, intent_rule_key
from mesh.watch import Put
from router.core import RouterSettings
from router.intents import SemanticRouter
from router.server import RouterServer, RouterServerSettings
from semantic.calibrate import cross_fit, rank
from semantic.embedder import AsyncEmbedder, Embedder
from semantic.local_model import LocalModel, ModelDirError
from semantic.matcher import MatchRule, decide
from semantic.outcome import IntentMatch, IntentRefusal
from semantic.settings import SemanticSettings
from storage_support import AGENTREACH


def test_vectors_give_the_similarities_the_model_is_published_with(minilm_dir: Path) -> None:
    model = LocalModel(minilm_dir)
    assert model.name == MODEL_NAME and model.dimensions == 384
    # Batched (padded to the longest) and alone, the vectors are the same.
    batch = model.encode([text for pair in PUBLISHED for text in pair[:2]])
    alone = np.concatenate([model.encode([text]) for pair in PUBLISHED for text in pair[:2]])
    assert np.allclose(batch, alone, atol=1e-5)
    unit = batch / np.linalg.norm(batch, axis=1, keepdims=True)
    for i, (_, _, published) in enumerate(PUBLISHED):
        assert float(unit[2 * i] @ unit[2 * i + 1]) == pytest.approx(published, abs=1e-3)


async def test_the_prompt_goes_before_every_text(minilm_dir: Path) -> None:
    plain = await AsyncEmbedder.load_dir(minilm_dir)
    prompted = await AsyncEmbedder.load_dir(minilm_dir, prompt="query: ")
    try:
        text = "where is my order"
        assert np.allclose((await prompted.encode([text]))[0], (await plain.encode([f"query: {text}"]))[0], atol=1e-6)
        assert not np.allclose((await prompted.encode([text]))[0], (await plain.encode([text]))[0], atol=1e-3)
    finally:
        plain.close()
        prompted.close()


async def test_the_model_loads_off_the_event_loop(minilm_dir: Path) -> None:
    embedder, ticks = await loop_turns_during(AsyncEmbedder.load_dir(minilm_dir))
    embedder.close()
    assert embedder.dimensions == 384
    assert ticks > 10  # reading 90 MB of weights and warming up: the loop ran meanwhile


def router_settings(embed_model: Path) -> RouterServerSettings:
    return RouterServerSettings(
        port=0,
        routing=RouterSettings(),
        auth=False,
        semantic=SemanticSettings(enabled=True, embed_model=str(embed_model)),
    )


async def test_healthz_and_metrics_name_each_model_and_its_vector_size(start_registry, http, minilm_dir: Path):
    registry = await start_registry(silence_timeout=60, health_interval=60)
    router = RouterServer(router_settings(minilm_dir), hub=registry.hub)
    await router.start()
    try:
        async with http.get(f"{router.url}/healthz") as response:
            health = await response.json()
        assert health["embedding_models"] == [
            {"model": "use-multilingual", "dimensions": 512, "rule": "model default", "off_languages": []},
            {"model": MODEL_NAME, "dimensions": 384, "rule": "uncalibrated", "off_languages": []},
        ]
        async with http.get(f"{router.url}/metrics") as response:
            metrics = await response.text()
        assert 'agentreach_router_embedding_model{dimensions="512",model="use-multilingual",stage="1"} 1.0' in metrics
        assert f'agentreach_router_embedding_model{{dimensions="384",model="{MODEL_NAME}",stage="2"}} 1.0' in metrics
    finally:
        await router.stop()


def broken_copies(minilm_dir: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Model directories an operator could point at by mistake, with what the error must say."""
    cases: dict[str, tuple[Path, str]] = {"missing": (root / "nowhere", "no such directory")}
    for case, damage, expected in (
        ("no weights", lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
        ("no tokenizer", lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
        ("bad config", lambda d: (d / "config.json").write_text("{not json"), "config.json is not readable"),
        ("not bert", lambda d: (d / "config.json").write_text(json.dumps({"model_type": "t5"})), "'t5'"),
        (
            "cut weights",
            lambda d: (d / "model.safetensors").write_bytes((minilm_dir / "model.safetensors").read_bytes()[:4096]),
            "model.safetensors is not readable",
        ),
    ):
        copy = root / case.replace(" ", "-")
        shutil.copytree(minilm_dir, copy)
        damage(copy)
        cases[case] = (copy, expected)
    return cases


async def test_a_missing_or_malformed_model_dir_stops_the_router_at_start_naming_the_path(
    start_registry, minilm_dir: Path, tmp_path: Path
):
    registry = await start_registry(silence_timeout=60, health_interval=60)
    for case, (directory, expected) in broken_copies(minilm_dir, tmp_path).items():
        router = RouterServer(router_settings(directory), hub=registry.hub)
        with pytest.raises(ModelDirError) as raised:
            await router.start()
        assert str(raised.value).startswith(f"--embed-model {directory}: "), case
        assert expected in str(raised.value), (case, str(raised.value))


def test_agentreach_refuses_to_start_a_router_whose_model_dir_is_missing(tmp_path: Path) -> None:
    """As an operator meets it: AGENTREACH_EMBED_MODEL set to a path that is not there."""
    missing = tmp_path / "models" / MODEL_NAME
    done = subprocess.run(
        [
            *AGENTREACH,
            "router",
            "--auth",
            "off",
            "--port",
            "0",
            "--no-audit",
            "--registry",
            "http://127.0.0.1:9",
            "--data-dir",
            str(tmp_path),
        ],
        env={**os.environ, "AGENTREACH_EMBED_MODEL": str(missing)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert f"agentreach: refusing to start: --embed-model {missing}: no such directory" in done.stderr


# Among the evaluation set's no-match intents: near misses of its capabilities (currency.convert,
# service.latency, calendar.schedule, account.password_reset, review.reply...).
NEAR_MISSES = {
    "convert 100 fahrenheit to celsius",
    "what's the latency of my home wifi",
    "generate a UUID",
    "reset my router to factory settings",
    "schedule a cron job to run every night",
    "生成一个随机数",
    "一英尺等于多少厘米",
    "review the movie I watched last night",
    "translate this Python function into Go",
}


@pytest.fixture
async def cascade(shipped: Embedder, minilm_dir: Path) -> AsyncIterator[SemanticRouter]:
    mirror = eval_mirror()
    router = SemanticRouter(
        mirror,
        AsyncEmbedder(shipped),
        SemanticSettings(enabled=True, max_capabilities=100),
        await AsyncEmbedder.load_dir(minilm_dir),
    )
    await router.refresh()
    yield router
    router.close()


async def test_the_operator_model_decides_an_intent_the_shipped_one_refused(cascade: SemanticRouter) -> None:
    intent = "search return flights to Barcelona"
    refused = await cascade.resolve(intent)
    # Uncalibrated, the operator's model is not asked: the shipped model's refusal stands.
    assert isinstance(refused, IntentRefusal) and refused.code is ErrorCode.INTENT_UNMATCHED
    assert [stage.model for stage in refused.stages] == ["use-multilingual"]
    assert cascade.stages[1].decided == {"routed": 0, "unmatched": 0, "ambiguous": 0, "skipped": 0}

    store_rule(cascade, 2, threshold=0.59, margin=0.2)
    match = await cascade.resolve(intent)
    assert isinstance(match, IntentMatch) and match.capability == "flight.search"
    first, second = match.stages
    assert first.model == "use-multilingual" and first.outcome == "unmatched" and first.score < first.threshold
    assert second.model == MODEL_NAME and second.outcome == "routed" and second.capability == "flight.search"
    assert second.score == match.score and (second.threshold, second.margin) == (0.59, 0.2)
    assert second.score - second.runner_up >= 0.2
    # What the shipped model routes by itself never reaches the operator's model.
    routed = await cascade.resolve("will it rain in Paris tomorrow")
    assert isinstance(routed, IntentMatch) and [stage.model for stage in routed.stages] == ["use-multilingual"]
    assert cascade.stages[1].decided["routed"] == 1 and cascade.stages[0].stats().rule == "model default"
    assert cascade.stages[1].stats().rule == "calibrated"


async def test_a_tie_under_the_shipped_model_is_refused_whatever_the_operator_model_would_say(
    cascade: SemanticRouter,
) -> None:
    # Under use-multilingual payment.charge and its runner-up are closer than the margin; all-MiniLM-L6-v2
    # would pick payment.charge by 0.11, which this rule lets through.
    intent = "bill the customer's wallet now"
    store_rule(cascade, 2, threshold=0.59, margin=0.1)
    refused = await cascade.resolve(intent)
    assert isinstance(refused, IntentRefusal) and refused.code is ErrorCode.INTENT_AMBIGUOUS
    assert [(stage.model, stage.outcome) for stage in refused.stages] == [("use-multilingual", "ambiguous")]
    names, scores = cascade.stages[1].index.scores(await cascade.stages[1].vector(intent))
    assert isinstance(decide(names, scores, MatchRule(threshold=0.59, margin=0.1)), IntentMatch)


async def test_a_refusal_by_both_names_each_model_and_its_scores(cascade: SemanticRouter) -> None:
    store_rule(cascade, 2, threshold=0.59, margin=0.2)
    refused = await cascade.resolve("compose a sonnet about autumn leaves")
    assert isinstance(refused, IntentRefusal) and refused.code is ErrorCode.INTENT_UNMATCHED
    first, second = refused.stages
    assert (first.outcome, second.outcome) == ("unmatched", "unmatched")
    assert refused.message.startswith(f"{MODEL_NAME}: No capability matches")
    assert f"asked first: use-multilingual {first.capability!r} at {first.score}" in refused.message
    # The candidates shown are the deciding model's, in its own scale.
    assert refused.candidates[0].capability == second.capability and refused.candidates[0].score == second.score
    # A rule stored for another vector size is some other model's of the same name: not taken up.
    cascade.mirror.apply(
        Put(
            revision=3,
            key=intent_rule_key(MODEL_NAME),
            value=IntentRule(threshold=0.1, margin=0.0, dimensions=768),
        )
    )
    await cascade.refresh()
    assert cascade.stages[1].rule is None and cascade.stages[1].source == "uncalibrated"


async def test_the_cascade_with_the_calibrated_rule_routes_no_evaluation_intent_wrongly(
    cascade: SemanticRouter,
) -> None:
    """Near misses included (unit conversions, generic utilities, names close to real capabilities)."""
    operator = cascade.stages[1]
    fit = cross_fit(await rank(operator.embedder, operator.index, EVAL.intents))
    store_rule(cascade, 2, threshold=fit.rule.threshold, margin=fit.rule.margin)
    wrong, lifted = [], 0
    for intent in EVAL.intents:
        decision = await cascade.resolve(intent.text)
        if isinstance(decision, IntentMatch):
            lifted += decision.stages[-1].model == MODEL_NAME
            if decision.capability != intent.label:
                wrong.append((intent.text, decision.capability, [s.model for s in decision.stages]))
    assert wrong == []
    assert lifted >= 5  # the second stage routed intents the first refused
    near_misses = [i for i in EVAL.intents if i.label is None and i.text in NEAR_MISSES]
    assert len(near_misses) == len(NEAR_MISSES)
