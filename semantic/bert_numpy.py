"""A BERT encoder's forward pass in numpy, from its safetensors weights: the token states an operator's
sentence-embedding model pools (semantic/local_model.py). The only packages it needs are `safetensors` and
numpy, a few MB, where torch would be 1 GB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from semantic.model_dir import ModelDirError

# Abramowitz and Stegun 7.1.26 (error below 1.5e-7, under float32's resolution): numpy has no erf.
_ERF_P = np.float32(0.3275911)
_ERF_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]


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


class BertNetwork:
    """The weights of ``directory``/model.safetensors, for the architecture its config.json describes."""

    def __init__(self, directory: Path, config: dict[str, Any]):
        if config.get("model_type") != "bert":
            raise ModelDirError(directory, f"config.json: model_type {config.get('model_type')!r} is not supported "
                                           "(only 'bert', or an ONNX export: model.onnx)")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ModelDirError(directory, f"config.json: hidden_act {config['hidden_act']!r} is not supported")
        self.dimensions = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        path = directory / "model.safetensors"
        if not path.is_file():
            raise ModelDirError(directory, "no model.safetensors (the weights) and no model.onnx")
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

    def forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's state of every token: (batch, width, dimensions); ``mask`` is 1 for a real token."""
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
        tokens: np.ndarray = x.reshape(batch, width, self.dimensions)
        return tokens
