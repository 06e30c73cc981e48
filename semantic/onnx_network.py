"""An ONNX export's forward pass through onnxruntime (the `embed-onnx` extra): the token states an operator's
sentence-embedding model pools (semantic/local_model.py), for any architecture the export holds.

The graph takes ``input_ids`` and ``attention_mask`` (and ``token_type_ids`` when it declares them), each as
int64 or int32 as it declares, and gives the last layer's states, ``last_hidden_state`` (batch, tokens,
dimensions), as Hugging Face Optimum and sentence-transformers' ONNX backend export it. A graph that takes
anything else (``position_ids``, a float mask) is refused as it loads, naming the input, not at the first
intent. It runs on one thread, as the numpy BERT does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from semantic.model_dir import ModelDirError
from semantic.settings import SemanticUnavailable

NEEDED_INPUTS = ("input_ids", "attention_mask")
KNOWN_INPUTS = (*NEEDED_INPUTS, "token_type_ids")
# The integer types an input may be declared as, and what it is fed as.
INTEGER_TYPES: dict[str, type[np.integer]] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
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
        self._inputs = input_types(directory, named, {item.name: item.type for item in self._session.get_inputs()})
        outputs = {item.name: item.shape for item in self._session.get_outputs()}
        shape = outputs.get(OUTPUT)
        if shape is None or len(shape) != 3 or not isinstance(shape[-1], int):
            raise ModelDirError(directory, f"{named} gives no {OUTPUT} of (batch, tokens, dimensions) (its outputs: "
                                           f"{outputs})")
        self.dimensions = int(shape[-1])
        self.max_tokens: int | None = None  # the graph does not say: the model's configuration decides

    def forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's state of every token: (batch, width, dimensions); ``mask`` is 1 for a real token."""
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feeds = {name: given[name].astype(dtype, copy=False) for name, dtype in self._inputs.items()}
        tokens: np.ndarray = self._session.run([OUTPUT], feeds)[0].astype(np.float32, copy=False)
        return tokens


def input_types(directory: Path, named: Path, inputs: dict[str, str]) -> dict[str, type[np.integer]]:
    """What each of the graph's inputs is fed as; a graph that needs what the tokenizer does not give (an input
    of another name or type, or without input_ids or attention_mask) is refused."""
    missing = [name for name in NEEDED_INPUTS if name not in inputs]
    if missing:
        raise ModelDirError(directory, f"{named} takes no {', '.join(missing)} (its inputs: {sorted(inputs)})")
    unknown = [name for name in inputs if name not in KNOWN_INPUTS]
    if unknown:
        raise ModelDirError(directory, f"{named} also takes {', '.join(unknown)}, which a sentence-embedding model "
                                       f"is not fed (it is fed {', '.join(KNOWN_INPUTS)})")
    untyped = [f"{name} as {kind}" for name, kind in inputs.items() if kind not in INTEGER_TYPES]
    if untyped:
        raise ModelDirError(directory, f"{named} takes {', '.join(untyped)}: token inputs are int64 or int32")
    return {name: INTEGER_TYPES[kind] for name, kind in inputs.items()}
