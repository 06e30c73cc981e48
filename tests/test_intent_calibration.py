"""`agentreach intents calibrate` on a real model, stored in a real registry, used by a real router's cascade.

The operator's model is all-MiniLM-L6-v2 from its PyPI wheel; the labelled intents and capabilities are
the evaluation set's (tests/semantic_eval), as an operator's own would be.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from conftest import wait_for
from embed_model_support import MODEL_NAME
from registry.server import RegistryServer, RegistrySettings
from router.core import RouterSettings
from router.server import RouterServer, RouterServerSettings
from router_support import Mesh, capability
from semantic.calibrate import load_eval_set
from semantic.local_model import ModelDirError
from semantic.settings import SemanticSettings
from storage_support import AGENTREACH

EVAL_DIR = Path(__file__).parent / "semantic_eval"
EVAL = load_eval_set(EVAL_DIR)


def intents_jsonl(path: Path) -> Path:
    path.write_text(
        "".join(json.dumps({"text": i.text, "label": i.label, "lang": i.lang}) + "\n" for i in EVAL.intents)
    )
    return path


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


async def calibrate(registry_url: str, model: Path, intents: Path, *extra: str) -> Done:
    """The command as an operator runs it; awaited, so the registry in this process keeps answering it."""
    process = await asyncio.create_subprocess_exec(
        *AGENTREACH,
        *("intents", "calibrate", "--model", str(model), "--set", str(intents), "--registry", registry_url),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return Done(process.returncode, stdout.decode(), stderr.decode())


async def test_calibrated_operator_model_routes_what_the_shipped_one_refused(
    start_registry, start_agent, http, minilm_dir: Path, tmp_path: Path
):
    registry = await start_registry(silence_timeout=60, health_interval=60)
    settings = RouterServerSettings(
        port=0,
        routing=RouterSettings(),
        auth=False,
        semantic=SemanticSettings(enabled=True, max_capabilities=100, embed_model=str(minilm_dir)),
    )
    router = RouterServer(settings, hub=registry.hub)
    await router.start()
    mesh = Mesh(registry, router, http)
    try:
        agent = await start_agent("eval-agent")
        await mesh.register(
            "eval-agent",
            [
                capability(c.name, agent.endpoint, description=c.description, examples=c.examples)
                for c in EVAL.capabilities
            ],
            service="eval",
        )
        await mesh.ready("eval-agent")
        assert router.semantic is not None
        await wait_for(
            lambda: len(router.semantic.stages[1].index.names) == len(EVAL.capabilities),
            timeout=60,
            what="the operator model's index to hold every capability",
        )
        intent = {"request_id": "flights-1", "intent": "search return flights to Barcelona", "payload": {}}
        async with http.post(f"{router.url}/atp", json=intent) as response:
            assert response.status == 422  # uncalibrated: the shipped model alone, which refuses it
            assert [s["model"] for s in (await response.json())["route"]["intent_stages"]] == ["use-multilingual"]

        done = await calibrate(registry.url, minilm_dir, intents_jsonl(tmp_path / "intents.jsonl"))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["model"] == MODEL_NAME and report["stored"] is True
        assert report["capabilities"] == len(EVAL.capabilities)
        assert set(report["held_out"]) == {"en", "zh"} and report["held_out"]["en"]["routable"] > 100
        # The stored rule is the stricter of the halves' and routes nothing wrongly on the whole set.
        halves = report["halves"]
        assert report["rule"]["threshold"] == max(h["threshold"] for h in halves)
        assert report["rule"]["margin"] == max(h["margin"] for h in halves)
        assert all(f["wrong"] == 0 for f in report["fitted"].values())
        # The no-match intents that come closest to routing: any above the threshold is held back by the margin.
        misses = report["near_misses"]
        assert len(misses) == 5 and [m["score"] for m in misses] == sorted((m["score"] for m in misses), reverse=True)
        assert all(m["below_threshold"] > 0 or m["gap"] < report["rule"]["margin"] for m in misses)
        assert "held out (each half's rule on the half it did not see):" in done.stderr
        # all-MiniLM-L6-v2 reads English, not Chinese: it is kept off Chinese intents.
        assert {lang: gate["decides"] for lang, gate in report["languages"].items()} == {"en": True, "zh": False}
        assert "  zh: off (7/33, 6/34)" in done.stderr

        async with http.get(f"{registry.url}/intent-rules/{MODEL_NAME}") as response:
            stored = await response.json()
        assert (stored["threshold"], stored["margin"], stored["dimensions"], stored["off_languages"]) == (
            report["rule"]["threshold"],
            report["rule"]["margin"],
            384,
            ["zh"],
        )
        await wait_for(
            lambda: router.semantic.stages[1].source == "calibrated", what="the router to take up the stored rule"
        )

        intent["request_id"] = "flights-2"
        async with http.post(f"{router.url}/atp", json=intent) as response:
            body = await response.json()
        assert response.status == 200, body
        assert body["route"]["capability"] == "flight.search" and agent.calls == 1
        first, second = body["route"]["intent_stages"]
        assert (first["model"], first["outcome"]) == ("use-multilingual", "unmatched")
        assert (second["model"], second["outcome"], second["capability"]) == (MODEL_NAME, "routed", "flight.search")
        assert body["route"]["match_score"] == second["score"] >= stored["threshold"]
        async with http.get(f"{router.url}/traces/flights-2") as response:
            traced = (await response.json())["call"]
        assert [s["model"] for s in traced["intent_stages"]] == ["use-multilingual", MODEL_NAME]
        async with http.get(f"{router.url}/healthz") as response:
            operator = (await response.json())["embedding_models"][1]
        assert (operator["rule"], operator["off_languages"]) == ("calibrated", ["zh"])
        # A Chinese intent the shipped model refuses is not put to the operator's model, and the route says so.
        random = {"request_id": "random-1", "intent": "生成一个随机数", "payload": {}}
        async with http.post(f"{router.url}/atp", json=random) as response:
            body = await response.json()
        assert response.status == 422, body
        assert [(s["model"], s["outcome"], s.get("language")) for s in body["route"]["intent_stages"]] == [
            ("use-multilingual", "unmatched", None),
            (MODEL_NAME, "skipped", "zh"),
        ]

        async with http.delete(f"{registry.url}/intent-rules/{MODEL_NAME}") as response:
            assert response.status == 200
        await wait_for(lambda: router.semantic.stages[1].rule is None, what="the deleted rule to be dropped")
    finally:
        await mesh.close()


async def test_calibrate_refuses_a_set_labelled_with_capabilities_that_are_not_there(minilm_dir: Path, tmp_path: Path):
    intents = tmp_path / "intents.jsonl"
    intents.write_text(json.dumps({"text": "book me a taxi", "label": "taxi.book", "lang": "en"}) + "\n")
    done = await calibrate(
        "http://127.0.0.1:9", minilm_dir, intents, "--capabilities", str(EVAL_DIR / "capabilities.json"), "--dry-run"
    )
    assert done.returncode == 2
    assert "labelled with capabilities that are not there: ['taxi.book']" in done.stderr


async def test_calibrate_reports_without_storing_on_a_dry_run(minilm_dir: Path, tmp_path: Path):
    done = await calibrate(
        "http://127.0.0.1:9",
        minilm_dir,
        intents_jsonl(tmp_path / "intents.jsonl"),
        "--capabilities",
        str(EVAL_DIR / "capabilities.json"),
        "--dry-run",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stored"] is False
    assert report["rule"]["threshold"] >= max(h["threshold"] for h in report["halves"])


async def test_the_registry_judges_examples_by_where_the_cascade_would_route(http, minilm_dir: Path, tmp_path: Path):
    """The shipped model alone lets "pretty-print this JSON now" join doc.ocr; with it there, the operator's model
    (asked by routers after the shipped one refuses) would send the no-match "pretty-print this JSON" to doc.ocr."""
    evaluation = tmp_path / "intents.json"
    evaluation.write_text((EVAL_DIR / "intents.json").read_text())
    settings = RegistrySettings(
        data_dir=tmp_path / "data", port=0, auth=False, example_evaluation=evaluation, embed_model=str(minilm_dir)
    )
    registry = RegistryServer(settings)
    await registry.start()
    try:
        body = {
            "agent_id": "eval-agent",
            "service": "eval",
            "capabilities": [
                capability(c.name, "http://127.0.0.1:9/call", description=c.description, examples=c.examples)
                for c in EVAL.capabilities
            ],
        }
        async with http.post(f"{registry.url}/register", json=body) as response:
            assert response.status == 200, await response.text()
        url = f"{registry.url}/examples/doc.ocr"
        async with http.post(url, json={"text": "pretty-print this JSON now"}) as response:
            judged = await response.json()
        # No rule is stored for the operator's model: routers do not ask it, so neither does the judge.
        assert response.status == 201 and judged["state"] == "accepted", judged
        async with http.delete(f"{url}/{judged['id']}") as response:
            assert response.status == 200
        rule = {"threshold": 0.54, "margin": 0.25, "dimensions": 384}
        async with http.put(f"{registry.url}/intent-rules/{MODEL_NAME}", json=rule) as response:
            assert response.status == 200
        async with http.post(url, json={"text": "pretty-print this JSON now"}) as response:
            judged = await response.json()
        assert response.status == 201 and judged["state"] == "rejected", judged
        assert judged["reason"] == (
            "with it, 'pretty-print this JSON' (labelled to route nowhere) would be routed to 'doc.ocr'"
        )
    finally:
        await registry.stop()


async def test_a_registry_whose_model_dir_is_missing_refuses_to_start(tmp_path: Path):
    missing = tmp_path / "models" / MODEL_NAME
    registry = RegistryServer(
        RegistrySettings(data_dir=tmp_path / "data", port=0, auth=False, embed_model=str(missing))
    )
    with pytest.raises(ModelDirError, match=f"^{re.escape(f'--embed-model {missing}: no such directory')}$"):
        await registry.start()
