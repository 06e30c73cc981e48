"""MPNet encoders (all-mpnet-base-v2's architecture) in the numpy forward pass (semantic/bert_numpy.py).

A small MPNet with random weights is held to a reference written token by token from Hugging Face's
MPNetModel: positions from the padding id + 1, no token types, and T5's relative position buckets added to
every layer's attention scores. The vectorised pass must agree with it, padded in a batch or alone.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from embed_model_support import minilm_dir  # noqa: F401  (the fixture: its tokenizer serves the small model)
from semantic.bert_numpy import relative_buckets
from semantic.local_model import LocalModel, ModelDirError

CONFIG = {"model_type": "mpnet", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 16, "max_position_embeddings": 64, "relative_attention_num_buckets": 32,
          "layer_norm_eps": 1e-5, "pad_token_id": 0, "hidden_act": "gelu"}
TEXTS = ["hi", "route this intent to the capability that converts currencies"]


def random_weights(vocab: int, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, inner = CONFIG["hidden_size"], CONFIG["intermediate_size"]

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    weights = {"embeddings.word_embeddings.weight": normal(vocab, hidden),
               "embeddings.position_embeddings.weight": normal(CONFIG["max_position_embeddings"], hidden),
               "embeddings.LayerNorm.weight": 1 + normal(hidden), "embeddings.LayerNorm.bias": normal(hidden),
               "encoder.relative_attention_bias.weight": normal(CONFIG["relative_attention_num_buckets"],
                                                                CONFIG["num_attention_heads"])}
    for i in range(CONFIG["num_hidden_layers"]):
        layer = f"encoder.layer.{i}"
        for part in "qkvo":
            weights[f"{layer}.attention.attn.{part}.weight"] = normal(hidden, hidden)
            weights[f"{layer}.attention.attn.{part}.bias"] = normal(hidden)
        weights |= {f"{layer}.attention.LayerNorm.weight": 1 + normal(hidden),
                    f"{layer}.attention.LayerNorm.bias": normal(hidden),
                    f"{layer}.intermediate.dense.weight": normal(inner, hidden),
                    f"{layer}.intermediate.dense.bias": normal(inner),
                    f"{layer}.output.dense.weight": normal(hidden, inner), f"{layer}.output.dense.bias": normal(hidden),
                    f"{layer}.output.LayerNorm.weight": 1 + normal(hidden),
                    f"{layer}.output.LayerNorm.bias": normal(hidden)}
    return weights


@pytest.fixture
def small_mpnet(tmp_path: Path, minilm_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:  # noqa: F811
    directory = tmp_path / "small-mpnet"
    directory.mkdir()
    shutil.copy(minilm_dir / "tokenizer.json", directory)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    weights = random_weights(len(vocab))
    save_file(weights, str(directory / "model.safetensors"))
    return directory, weights


def bucket(query: int, key: int, buckets: int = 32, max_distance: int = 128) -> int:
    """MPNetModel's relative_position_bucket for one pair, as its code reads (n = query - key)."""
    n, half = query - key, buckets // 2
    ret = half if n < 0 else 0
    n = abs(n)
    exact = half // 2
    if n < exact:
        return ret + n
    large = exact + int(np.float32(math.log(n / exact)) / np.float32(math.log(max_distance / exact)) * (half - exact))
    return ret + min(large, half - 1)


def reference(ids: list[int], weights: dict[str, np.ndarray]) -> np.ndarray:
    """One sentence's mean-pooled state, token by token and head by head, in float64."""
    w = {name: value.astype(np.float64) for name, value in weights.items()}
    heads, size = CONFIG["num_attention_heads"], CONFIG["hidden_size"] // CONFIG["num_attention_heads"]

    def norm(x: np.ndarray, prefix: str) -> np.ndarray:
        return (x - x.mean()) / math.sqrt(x.var() + 1e-5) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]

    def linear(x: np.ndarray, prefix: str) -> np.ndarray:
        return w[f"{prefix}.weight"] @ x + w[f"{prefix}.bias"]

    first = CONFIG["pad_token_id"] + 1
    states = [norm(w["embeddings.word_embeddings.weight"][t] + w["embeddings.position_embeddings.weight"][first + i],
                   "embeddings.LayerNorm") for i, t in enumerate(ids)]
    relative = w["encoder.relative_attention_bias.weight"]
    for layer in range(CONFIG["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}"
        q, k, v = ([linear(x, f"{prefix}.attention.attn.{part}") for x in states] for part in "qkv")
        attended = []
        for i in range(len(ids)):
            context = np.zeros(CONFIG["hidden_size"])
            for h in range(heads):
                part = slice(h * size, (h + 1) * size)
                scores = [q[i][part] @ k[j][part] / math.sqrt(size) + relative[bucket(i, j), h]
                          for j in range(len(ids))]
                probabilities = np.exp(np.array(scores) - max(scores))
                probabilities /= probabilities.sum()
                context[part] = sum(p * v[j][part] for j, p in enumerate(probabilities))
            attended.append(norm(linear(context, f"{prefix}.attention.attn.o") + states[i],
                                 f"{prefix}.attention.LayerNorm"))
        states = []
        for x in attended:
            up = linear(x, f"{prefix}.intermediate.dense")
            inner = np.array([0.5 * u * (1 + math.erf(u / math.sqrt(2))) for u in up])
            states.append(norm(linear(inner, f"{prefix}.output.dense") + x, f"{prefix}.output.LayerNorm"))
    return np.mean(states, axis=0)


def test_relative_buckets_as_t5_places_them() -> None:
    found = relative_buckets(200, 32)
    # Query after key (positive distance): exact below 8, then 8 + log-spaced to 15; query before key: +16.
    expected = {0: 0, 1: 1, 7: 7, 8: 8, 11: 8, 12: 9, 16: 10, 31: 11, 32: 12, 63: 13, 64: 14, 127: 15, 128: 15, 199: 15}
    for distance, place in expected.items():
        assert found[distance, 0] == place, distance
        if distance:
            assert found[0, distance] == place + 16, distance
    assert all(found[i, j] == bucket(i, j) for i in range(0, 200, 7) for j in range(0, 200, 5))


def test_a_small_mpnet_agrees_with_a_reference_written_token_by_token(small_mpnet) -> None:
    directory, weights = small_mpnet
    model = LocalModel(directory)
    assert model.dimensions == CONFIG["hidden_size"]
    batched = model.encode(TEXTS)  # the short text padded to the long one's width
    for row, text in enumerate(TEXTS):
        ids = model._tokenizer.encode(text).ids
        expected = reference(ids, weights)
        np.testing.assert_allclose(batched[row], expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(model.encode([text])[0], expected, rtol=1e-4, atol=1e-4)


def test_an_mpnet_without_its_relative_bias_is_refused_naming_the_weight(small_mpnet) -> None:
    directory, weights = small_mpnet
    del weights["encoder.relative_attention_bias.weight"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(ModelDirError) as refused:
        LocalModel(directory)
    assert str(directory) in str(refused.value) and "encoder.relative_attention_bias.weight" in str(refused.value)


def test_an_unknown_architecture_is_refused_naming_those_supported(small_mpnet) -> None:
    directory, _ = small_mpnet
    (directory / "config.json").write_text(json.dumps(CONFIG | {"model_type": "xlm-roberta"}))
    with pytest.raises(ModelDirError) as refused:
        LocalModel(directory)
    assert "'xlm-roberta'" in str(refused.value) and "'bert' or 'mpnet'" in str(refused.value)


def test_an_intent_longer_than_the_model_reads_is_cut_to_the_positions_it_has(small_mpnet) -> None:
    """MPNet's positions start past the padding id, so it reads two tokens fewer than max_position_embeddings:
    a longer text is truncated to what it can place, not fed past its last position."""
    directory, weights = small_mpnet
    model = LocalModel(directory)
    long_text = " ".join(["convert"] * 200)
    ids = model._tokenizer.encode(long_text).ids
    assert len(ids) == CONFIG["max_position_embeddings"] - CONFIG["pad_token_id"] - 1
    np.testing.assert_allclose(model.encode([long_text, "hi"])[0], reference(ids, weights), rtol=1e-4, atol=1e-4)
