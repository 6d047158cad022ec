"""The GPU kit's pure modules (scripts/gpu_kit), loaded under names of their own."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

KIT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_kit"


def load(name: str) -> ModuleType:
    """``scripts/gpu_kit/<name>.py`` as the module ``gpu_kit_<name>``."""
    qualified = f"gpu_kit_{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, KIT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module
