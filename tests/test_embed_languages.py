"""The operator's model decides only the languages its calibration found it reads.

all-MiniLM-L6-v2 (the real model, from its PyPI wheel) is English-only: its scores on Chinese intents mean
little, so calibration keeps its stage off Chinese and every router holding the stored rule skips it there,
while an old rule without the field still has it decide every language.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from agent_reach.atp import ErrorCode

from embed_model_support import EVAL, MODEL_NAME, eval_mirror
from mesh.intent_rules import IntentRule, intent_rule_key
from mesh.watch import Put
from router.intents import SemanticRouter
from semantic.calibrate import LabelledIntent, Ranked, accuracy, cross_fit, is_calibration, off_languages, rank
from semantic.embedder import AsyncEmbedder, Embedder
from semantic.index import CapabilityIndex
from semantic.language import language
from semantic.outcome import IntentMatch, IntentRefusal
from semantic.settings import SemanticSettings

# Neither the shipped model routes it nor is it any capability's; all-MiniLM-L6-v2 puts it on review.reply
# at 0.88, far above any rule fitted for it.
CHINESE_NEAR_MISS = "生成一个随机数"
ENGLISH = "search return flights to Barcelona"


async def ranked_by(directory: Path) -> list[Ranked]:
    embedder = await AsyncEmbedder.load_dir(directory)
    try:
        index = CapabilityIndex(embedder)
        await index.update(EVAL.capability_texts())
        return await rank(embedder, index, EVAL.intents)
    finally:
        embedder.close()


@pytest.fixture(scope="module")
def minilm_ranked(minilm_dir: Path) -> list[Ranked]:
    """The evaluation set's intents ranked by all-MiniLM-L6-v2 against its capabilities, once for the module."""
    return asyncio.run(ranked_by(minilm_dir))


def test_an_intent_is_chinese_when_its_cjk_characters_outnumber_its_latin_words() -> None:
    assert language("作废发票INV-1043") == "zh" and language("convert 100 USD to 人民币") == "en"
    assert language("12345") == "en" and language("") == "en"
    assert [i.text for i in EVAL.intents if language(i.text) != i.lang] == []


def test_calibration_keeps_the_model_off_a_language_where_it_only_adds_wrong_routes(
    minilm_ranked: list[Ranked],
) -> None:
    # A small set: the English intents of a few capabilities, and Chinese ones the model misranks.
    english = [item for item in minilm_ranked if item.intent.lang == "en"][:80]
    chinese = [item for item in minilm_ranked if item.intent.lang == "zh" and item.best != item.intent.label]
    fit = cross_fit(english + chinese)
    # Without the gate, the rule fitted on the other half routes Chinese intents, all wrongly.
    unseen = [(item, fit.halves[1] if is_calibration(item.intent) else fit.halves[0]) for item in chinese]
    misrouted = sum(accuracy([item], rule).wrong for item, rule in unseen)
    assert misrouted > 0 and sum(accuracy([item], rule).correct for item, rule in unseen) == 0
    assert fit.languages["zh"].halves == (False, False) and fit.languages["zh"].ranked_first == (0, 0)
    assert fit.languages["en"].decides and off_languages(fit.languages) == {"zh"}
    # With it, the half that did not see them routes none; English keeps its routes.
    assert (fit.held_out["zh"].correct, fit.held_out["zh"].wrong) == (0, 0)
    assert fit.held_out["en"].correct > 0 and fit.fitted["zh"].wrong == 0


def test_calibration_keeps_the_model_on_every_language_it_reads(minilm_ranked: list[Ranked]) -> None:
    english = [item for item in minilm_ranked if item.intent.lang == "en"]
    fit = cross_fit(english)
    assert set(fit.languages) == {"en"} and off_languages(fit.languages) == frozenset()
    first, second = fit.languages["en"].ranked_first
    assert first * 2 > fit.languages["en"].routable[0] and second * 2 > fit.languages["en"].routable[1]
    # On the whole evaluation set the model ranks 13 of 67 Chinese intents right: off for Chinese only.
    assert off_languages(cross_fit(minilm_ranked).languages) == {"zh"}


def test_a_language_with_no_routable_intent_in_a_half_is_off() -> None:
    """No evidence the model reads it on that half: off, as where it misranks."""
    chinese = next(i for i in EVAL.intents if i.lang == "zh" and i.label is not None and is_calibration(i))
    label = chinese.label
    assert label is not None
    english = [LabelledIntent(f"do task number {n}", label, "en") for n in range(40)]
    fit = cross_fit([Ranked(intent=intent, best=label, score=0.9, runner_up=0.1, candidates=(label,))
                     for intent in [*english, chinese]])
    assert fit.languages["zh"].routable == (1, 0) and fit.languages["zh"].halves == (True, False)
    assert not fit.languages["zh"].decides and fit.languages["en"].decides


@pytest.fixture
async def cascade(shipped: Embedder, minilm_dir: Path) -> AsyncIterator[SemanticRouter]:
    router = SemanticRouter(eval_mirror(), AsyncEmbedder(shipped), SemanticSettings(enabled=True, max_capabilities=100),
                            await AsyncEmbedder.load_dir(minilm_dir))
    await router.refresh()
    yield router
    router.close()


async def store(router: SemanticRouter, rule: IntentRule) -> None:
    router.mirror.apply(Put(revision=2, key=intent_rule_key(MODEL_NAME), value=rule))
    await router.refresh()


async def test_a_router_with_the_stored_rule_skips_the_model_for_an_off_language(cascade: SemanticRouter) -> None:
    await store(cascade, IntentRule(threshold=0.59, margin=0.2, dimensions=384, off_languages=["zh"]))
    refused = await cascade.resolve(CHINESE_NEAR_MISS)
    assert isinstance(refused, IntentRefusal) and refused.code is ErrorCode.INTENT_UNMATCHED
    first, second = refused.stages
    assert (first.model, first.outcome) == ("use-multilingual", "unmatched")
    assert (second.model, second.outcome, second.language, second.capability) == (MODEL_NAME, "skipped", "zh", None)
    # The shipped model's refusal stands, with its candidates, and says which model was not asked and why.
    assert refused.candidates[0].capability == first.capability and refused.candidates[0].score == first.score
    assert refused.message.startswith("No capability matches")
    assert refused.message.endswith(f"({MODEL_NAME} not asked: calibrated not to decide zh intents)")
    assert cascade.stages[1].decided == {"routed": 0, "unmatched": 0, "ambiguous": 0, "skipped": 1}
    # English is on: the model routes what the shipped one refused.
    match = await cascade.resolve(ENGLISH)
    assert isinstance(match, IntentMatch) and match.capability == "flight.search"
    assert [(stage.model, stage.outcome) for stage in match.stages] == [
        ("use-multilingual", "unmatched"), (MODEL_NAME, "routed")]


async def test_an_old_rule_without_the_field_has_the_model_decide_every_language(cascade: SemanticRouter) -> None:
    old = msgspec.json.decode(b'{"threshold": 0.59, "margin": 0.2, "dimensions": 384}', type=IntentRule)
    assert old.off_languages == []
    # A rule with every language on is stored as before the field: routers that predate it read it.
    assert b"off_languages" not in msgspec.msgpack.encode(old)
    await store(cascade, old)
    routed = await cascade.resolve(CHINESE_NEAR_MISS)
    assert isinstance(routed, IntentMatch) and routed.capability == "review.reply"  # the wrong route the gate stops
    assert [(stage.model, stage.outcome) for stage in routed.stages] == [
        ("use-multilingual", "unmatched"), (MODEL_NAME, "routed")]
    match = await cascade.resolve(ENGLISH)
    assert isinstance(match, IntentMatch) and match.capability == "flight.search"


@pytest.mark.parametrize(("languages", "why"), [
    ([f"l{i}" for i in range(33)], "more than 32 languages"),
    (["a-language-name-far-too-long"], "a language name past 16 characters"),
    (["en", 7], "a language that is not a string"),
])
async def test_a_rule_with_unreasonable_off_languages_is_refused_whole(registry, http, languages, why) -> None:
    url = f"{registry.url}/intent-rules/{MODEL_NAME}"
    rule = {"threshold": 0.5, "margin": 0.1, "dimensions": 384, "off_languages": languages}
    async with http.put(url, json=rule) as response:
        body = await response.json()
    assert response.status == 400, why
    assert body["field"].startswith("off_languages"), body
    async with http.get(url) as response:
        assert response.status == 404  # nothing of it was stored
