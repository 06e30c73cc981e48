"""What every loader of an operator's model directory shares: its error, and reading its JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from semantic.settings import SemanticUnavailable


class ModelDirError(SemanticUnavailable):
    """The directory given as an embedding model is missing, incomplete or of a kind this loader cannot run."""

    def __init__(self, directory: Path, problem: str):
        super().__init__(f"--embed-model {directory}: {problem}")
        self.directory = directory


def read_json(directory: Path, name: str, required: bool = True) -> Any:
    path = directory / name
    if not path.is_file():
        if required:
            raise ModelDirError(directory, f"no {name}")
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ModelDirError(directory, f"{name} is not readable JSON ({exc})") from None
