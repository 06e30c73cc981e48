"""An ONNX export's forward pass through onnxruntime (the `embed-onnx` extra): the token states an operator's
sentence-embedding model pools (semantic/local_model.py), for any architecture the export holds.

The graph takes ``input_ids`` and ``attention_mask`` (and ``token_type_ids`` when it declares them) and gives
the last layer's states, ``last_hidden_state`` (batch, tokens, dimensions), as Hugging Face Optimum and
sentence-transformers' ONNX backend export it. It runs on one thread, as the numpy BERT does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from semantic.model_dir import ModelDirError
from semantic.settings import SemanticUnavailable

NEEDED_INPUTS = ("input_ids", "attention_mask")
OUTPUT = "last_hidden_state"


class OnnxNetwork:
    def __init__(self, directory: Path, path: Path):
        try:
            import onnxruntime
        except ImportError as exc:
            raise SemanticUnavailable(
                f"--embed-model {directory} is an ONNX model: it needs the embed-onnx extra ({exc.name} is missing): "
                "pip install 'agent-reach[embed-onnx]'"
            ) from exc
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 3  # its warnings are about graph optimisations, not about the model
        named = path.relative_to(directory)
        try:
            self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types, not importable by a stable name
            raise ModelDirError(directory, f"{named} is not an ONNX model onnxruntime can run ({exc})") from None
        inputs = {item.name for item in self._session.get_inputs()}
        missing = [name for name in NEEDED_INPUTS if name not in inputs]
        if missing:
            raise ModelDirError(directory, f"{named} takes no {', '.join(missing)} (its inputs: {sorted(inputs)})")
        self._types = "token_type_ids" in inputs
        outputs = {item.name: item.shape for item in self._session.get_outputs()}
        shape = outputs.get(OUTPUT)
        if shape is None or len(shape) != 3 or not isinstance(shape[-1], int):
            raise ModelDirError(directory, f"{named} gives no {OUTPUT} of (batch, tokens, dimensions) (its outputs: "
                                           f"{outputs})")
        self.dimensions = int(shape[-1])

    def forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's state of every token: (batch, width, dimensions); ``mask`` is 1 for a real token."""
        feeds = {"input_ids": ids, "attention_mask": mask.astype(np.int64)}
        if self._types:
            feeds["token_type_ids"] = types
        tokens: np.ndarray = self._session.run([OUTPUT], feeds)[0].astype(np.float32, copy=False)
        return tokens
