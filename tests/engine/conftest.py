"""Engine tests share one tiny model, built once per session from a seed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_graphsafe.local_engine.tiny_model import build_tiny_model

    cache = os.environ.get("VLLM_GRAPHSAFE_CACHE") or tmp_path_factory.mktemp("models")
    return build_tiny_model(cache, seed=0)
