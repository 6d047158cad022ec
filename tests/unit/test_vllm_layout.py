"""``vllm_layout`` loads vLLM only when asked, and fails the way an import does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_graphsafe import vllm_layout

REPO = Path(__file__).resolve().parents[2]


def test_importing_it_needs_no_vllm() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['vllm'] = None\n"
            "from vllm_graphsafe import vllm_layout\n"
            "print(sorted(m for m in sys.modules if m.startswith('vllm.')))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_missing_name_is_an_import_error_like_from_import() -> None:
    assert vllm_layout.load_name("json", "dumps") is __import__("json").dumps
    with pytest.raises(ImportError, match="no_such_name"):
        vllm_layout.load_name("json", "no_such_name")
    with pytest.raises(ImportError):
        vllm_layout.load("vllm_graphsafe.no_such_module")


def test_every_speculator_lives_under_the_spec_decode_package() -> None:
    modules = [module for module, _ in vllm_layout.MRV2_SPECULATORS]
    assert len(set(modules)) == len(modules)
    assert all(
        module.startswith(f"{vllm_layout.MRV2_SPEC_DECODE}.")
        and module.endswith(".speculator")
        for module in modules
    )
