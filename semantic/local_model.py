"""An operator's own sentence-embedding model from a local directory (`--embed-model DIR`), never downloaded.

Layouts: a sentence-transformers folder (modules.json, config.json, model.safetensors, tokenizer.json,
1_Pooling/config.json) or a bare Hugging Face folder (config.json, model.safetensors, tokenizer.json; mean
pooling) of a BERT or MPNet encoder, run in numpy (semantic/bert_numpy.py, the `embed-model` extra); or
an ONNX export with its tokenizer (model.onnx, or onnx/model.onnx inside a sentence-transformers folder,
beside tokenizer.json), run by onnxruntime (semantic/onnx_network.py, the `embed-onnx` extra), whatever its
architecture. Here: the tokenizer, the prompt, batching and pooling, which every layout shares.

A directory that is not such a model is refused when it loads, with the path and what is wrong, so
a router started with it fails at start-up rather than on its first intent.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from semantic.model_dir import ModelDirError, read_json
from semantic.settings import SemanticUnavailable

__all__ = ["LocalModel", "ModelDirError"]

# Texts run through the network at once when embedding many: sorted by length so padding stays short.
BATCH = 16
POOLINGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
# Where an ONNX export sits: an Optimum export's folder, or a sentence-transformers folder's ONNX backend.
ONNX_FILES = ("model.onnx", "onnx/model.onnx")
DEFAULT_MAX_TOKENS = 512


def _missing(exc: ImportError) -> SemanticUnavailable:
    return SemanticUnavailable(f"--embed-model needs the embed-model extra ({exc.name} is missing): "
                               "pip install 'agent-reach[embed-model]'")


class Network(Protocol):
    dimensions: int
    max_tokens: int | None  # the longest text (in tokens) it can place; None: no limit of its own

    def forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray: ...


class LocalModel:
    """A sentence encoder from ``directory``; ``prompt`` is put before every text it embeds.

    Capability descriptions and examples are phrasings of intents, so they take the same prompt as
    intents (a model card's query prefix, such as "query: ").
    """

    threshold = 1.01  # routes nothing until a rule is calibrated for it (cosine scores differ per model)
    margin = 0.0

    def __init__(self, directory: Path, prompt: str = ""):
        try:
            from threadpoolctl import threadpool_limits
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise _missing(exc) from exc

        # Each product here is small: on 2 cores, BLAS threads cost 10x more in hand-offs than they win
        # (0.17 against 1.7 ms for a 10x384 by 384x1152 product, measured). One thread, as the worker is one.
        threadpool_limits(1, user_api="blas")

        self.directory = directory
        self.prompt = prompt
        if not directory.is_dir():
            raise ModelDirError(directory, "no such directory")
        onnx = next((directory / name for name in ONNX_FILES if (directory / name).is_file()), None)
        config = read_json(directory, "config.json", required=onnx is None) or {}
        if not isinstance(config, dict):
            raise ModelDirError(directory, "config.json is not a JSON object")
        self.name = directory.name
        self._pooling = self._pooling_of(directory)
        self._network = self._network_of(directory, onnx, config)
        self.dimensions = self._network.dimensions
        if not (directory / "tokenizer.json").is_file():
            raise ModelDirError(directory, "no tokenizer.json (the fast tokenizer file the model was saved with)")
        try:
            self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a malformed file
            raise ModelDirError(directory, f"tokenizer.json is not a tokenizer ({exc})") from None
        bert = read_json(directory, "sentence_bert_config.json", required=False) or {}
        self._tokenizer.no_padding()
        configured = int(bert.get("max_seq_length") or config.get("max_position_embeddings") or DEFAULT_MAX_TOKENS)
        network_limit = self._network.max_tokens
        self._tokenizer.enable_truncation(configured if network_limit is None else min(configured, network_limit))
        self._pad = int(config.get("pad_token_id", 0))

    @staticmethod
    def _network_of(directory: Path, onnx: Path | None, config: dict[str, object]) -> Network:
        if onnx is not None:
            from semantic.onnx_network import OnnxNetwork

            return OnnxNetwork(directory, onnx)
        try:
            from semantic.bert_numpy import BertNetwork
        except ImportError as exc:
            raise _missing(exc) from exc
        return BertNetwork(directory, config)

    @staticmethod
    def _pooling_of(directory: Path) -> str:
        modules = read_json(directory, "modules.json", required=False)
        if modules is None:
            return "mean"
        kinds = {str(module.get("type", "")).rsplit(".", 1)[-1]: module.get("path", "") for module in modules}
        unknown = set(kinds) - {"Transformer", "Pooling", "Normalize"}
        if unknown:
            raise ModelDirError(directory, f"modules.json: modules {sorted(unknown)} are not supported")
        if "Pooling" not in kinds:
            return "mean"
        pooling = read_json(directory / kinds["Pooling"], "config.json")
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
            rows[chosen] = self._pooled(self._network.forward(ids, types, mask), mask)
        return rows

    def _pooled(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self._pooling == "cls":
            first: np.ndarray = tokens[:, 0]
            return first
        pooled: np.ndarray = (tokens * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
        return pooled
