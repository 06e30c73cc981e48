"""A BERT or MPNet encoder's forward pass in numpy, from its safetensors weights: the token states an
operator's sentence-embedding model pools (semantic/local_model.py). The only packages it needs are
`safetensors` and numpy, a few MB, where torch would be 1 GB.

The two share the transformer layer; MPNet (all-mpnet-base-v2's architecture) differs in three places,
each as Hugging Face's MPNetModel has it: its weights' names, positions counted from the padding id + 1
with no token types, and a relative position bias (T5's bidirectional buckets) added to every layer's
attention scores.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

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


class Architecture(NamedTuple):
    saved_prefix: str  # what a task model's weights start with ("bert.": saved from BertForMaskedLM, say)
    attention: tuple[str, str, str, str, str]  # a layer's query, key, value, output and its LayerNorm
    default_eps: float


ARCHITECTURES = {
    "bert": Architecture("bert.", ("attention.self.query", "attention.self.key", "attention.self.value",
                                   "attention.output.dense", "attention.output.LayerNorm"), 1e-12),
    "mpnet": Architecture("mpnet.", ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                                     "attention.LayerNorm"), 1e-5),
}
RELATIVE_MAX_DISTANCE = 128  # MPNet's, fixed in its code rather than in config.json


def relative_buckets(width: int, buckets: int, max_distance: int = RELATIVE_MAX_DISTANCE) -> np.ndarray:
    """The bucket of every key's offset from every query, (width, width): exact near the diagonal, then
    logarithmic out to ``max_distance``, one half of the buckets for each direction. In float32, as MPNet
    computes it, so an offset on a bucket's edge lands where the model was trained to see it."""
    position = np.arange(width)
    distance = position[:, None] - position[None, :]  # query's position minus key's
    half = buckets // 2
    exact = half // 2
    ahead = (distance < 0).astype(np.int64) * half
    distance = np.abs(distance)
    scaled = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact)) \
        / np.float32(math.log(max_distance / exact)) * np.float32(half - exact)
    far = np.minimum(exact + scaled.astype(np.int64), half - 1)
    bucket: np.ndarray = ahead + np.where(distance < exact, distance, far)
    return bucket


class _Layer:
    """One transformer layer's weights, transposed once for ``x @ w``, with Q, K and V fused."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str, architecture: Architecture):
        def get(name: str) -> np.ndarray:
            return weights[f"{prefix}.{name}"]

        query, key, value, out, norm = architecture.attention
        self.qkv = np.ascontiguousarray(np.concatenate([get(f"{part}.weight") for part in (query, key, value)]).T)
        self.qkv_bias = np.concatenate([get(f"{part}.bias") for part in (query, key, value)])
        self.out = np.ascontiguousarray(get(f"{out}.weight").T)
        self.out_bias = get(f"{out}.bias")
        self.norm1 = (get(f"{norm}.weight"), get(f"{norm}.bias"))
        self.up = np.ascontiguousarray(get("intermediate.dense.weight").T)
        self.up_bias = get("intermediate.dense.bias")
        self.down = np.ascontiguousarray(get("output.dense.weight").T)
        self.down_bias = get("output.dense.bias")
        self.norm2 = (get("output.LayerNorm.weight"), get("output.LayerNorm.bias"))


class BertNetwork:
    """The weights of ``directory``/model.safetensors, for the architecture its config.json describes."""

    def __init__(self, directory: Path, config: dict[str, Any]):
        architecture = ARCHITECTURES.get(str(config.get("model_type")))
        if architecture is None:
            raise ModelDirError(directory, f"config.json: model_type {config.get('model_type')!r} is not supported "
                                           f"(only {' or '.join(map(repr, ARCHITECTURES))}, or an ONNX export: "
                                           "model.onnx)")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ModelDirError(directory, f"config.json: hidden_act {config['hidden_act']!r} is not supported")
        self.dimensions = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config.get("layer_norm_eps", architecture.default_eps))
        path = directory / "model.safetensors"
        if not path.is_file():
            raise ModelDirError(directory, "no model.safetensors (the weights) and no model.onnx")
        try:
            weights = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelDirError(directory, f"model.safetensors is not readable ({exc})") from None
        # Saved from a BertModel the names start at "embeddings."; from a task model, at "bert." (or "mpnet.").
        weights = {key.removeprefix(architecture.saved_prefix): value.astype(np.float32, copy=False)
                   for key, value in weights.items()}
        mpnet = architecture is ARCHITECTURES["mpnet"]
        # MPNet counts positions from the padding id + 1 (as RoBERTa does); BERT from 0.
        self._first_position = int(config.get("pad_token_id", 1)) + 1 if mpnet else 0
        try:
            self._words = weights["embeddings.word_embeddings.weight"]
            self._positions = weights["embeddings.position_embeddings.weight"]
            self._types = None if mpnet else weights["embeddings.token_type_embeddings.weight"]
            self._relative = weights["encoder.relative_attention_bias.weight"] if mpnet else None
            self._norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
            self._layers = [_Layer(weights, f"encoder.layer.{i}", architecture)
                            for i in range(int(config["num_hidden_layers"]))]
        except KeyError as exc:
            raise ModelDirError(directory, f"model.safetensors has no weight {exc.args[0]!r}") from None
        # The tokens one text may have: as many as there are positions past the first one used.
        self.max_tokens: int | None = self._positions.shape[0] - self._first_position
        if self._words.shape[1] != self.dimensions:
            raise ModelDirError(
                directory, f"config.json says hidden_size {self.dimensions}, the weights {self._words.shape[1]}"
            )

    def forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's state of every token: (batch, width, dimensions); ``mask`` is 1 for a real token."""
        batch, width = ids.shape
        heads, size = self._heads, self.dimensions // self._heads
        embedded = self._words[ids] + self._positions[self._first_position:self._first_position + width]
        if self._types is not None:
            embedded += self._types[types]
        # Tokens as rows of one matrix: every linear layer is then one BLAS product.
        x = _layer_norm(embedded.reshape(-1, self.dimensions), *self._norm, self._eps)
        # Padding is never attended to: its keys score far below any real one.
        hidden = ((mask - 1) * np.float32(1e9))[:, None, None, :]
        if self._relative is not None:  # (heads, width, width), the same for every layer
            buckets = relative_buckets(width, self._relative.shape[0])
            hidden = hidden + self._relative[buckets].transpose(2, 0, 1)[None]
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
