"""The replay guard is ``native`` only where vLLM's replay itself runs a step
holding a prefill without the graph; an assert there is not the fix.

Synthetic vLLM trees (``SourceReader(root=...)``): a pristine replay, one that
asserts, and the tree the backport edits (its own planner applied to the
pristine one), with and without Model Runner V2.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vllm_graphsafe.fixes.replay_guard import backport, judge
from vllm_graphsafe.sources import SourceReader
from vllm_graphsafe.tree_edits.tree import Tree

FORWARD_CONTEXT = """
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@dataclass
class ForwardContext:
    attn_metadata: dict
    cudagraph_runtime_mode: object = None
    batch_descriptor: BatchDescriptor | None = None
"""

CUDA_GRAPH = """
from typing import Any

from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger

logger = init_logger(__name__)


class CUDAGraphWrapper:
    def __init__(self, runnable, vllm_config, runtime_mode):
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.concrete_cudagraph_entries = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward_context = get_forward_context()
        batch_descriptor = forward_context.batch_descriptor
        cudagraph_runtime_mode = forward_context.cudagraph_runtime_mode

        if (
            cudagraph_runtime_mode == CUDAGraphMode.NONE
            or cudagraph_runtime_mode != self.runtime_mode
        ):
            return self.runnable(*args, **kwargs)
@@CHECK@@
        entry = self.concrete_cudagraph_entries[batch_descriptor]
        entry.cudagraph.replay()
        return entry.output
"""

ASSERTS = """
        metadata = forward_context.attn_metadata.values()
        assert not any(m.num_prefills for m in metadata), "a FULL decode graph"
"""

UTILITIES = """
from dataclasses import dataclass
from typing import Any

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None


class CudaGraphManager:
    def run_fullgraph(self, desc):
        self.graphs[desc].replay()


class ModelCudaGraphManager(CudaGraphManager):
    def run_fullgraph(self, desc):
        super().run_fullgraph(desc)
        return self.hidden_states[: desc.num_tokens]
"""

RUNNER = """
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


class GPUModelRunner:
    def execute_model(self, scheduler_output):
        batch_desc = self.dispatch(scheduler_output)
        attn_metadata = self.model_state.prepare_attn(batch_desc.cg_mode)
        model_inputs = {}
        # Run model.
        if batch_desc.cg_mode == CUDAGraphMode.FULL:
            model_output = self.cudagraph_manager.run_fullgraph(batch_desc)
        else:
            mode = batch_desc.cg_mode
            with set_forward_context(attn_metadata, cudagraph_runtime_mode=mode):
                model_output = self.model(**model_inputs)
        return model_output
"""


def write_tree(root: Path, check: str = "", mrv2: bool = False) -> Path:
    files = {
        "vllm/forward_context.py": FORWARD_CONTEXT,
        "vllm/compilation/cuda_graph.py": CUDA_GRAPH.replace("@@CHECK@@", check),
    }
    if mrv2:
        files["vllm/v1/worker/gpu/cudagraph_utils.py"] = UTILITIES
        files["vllm/v1/worker/gpu/model_runner.py"] = RUNNER
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return root


def backported(root: Path) -> Path:
    plan = backport.plan(Tree(root))
    for relpath, text in plan.texts.items():
        (root / relpath).write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize("mrv2", [False, True])
def test_a_pristine_replay_needs_the_guard(tmp_path: Path, mrv2: bool) -> None:
    root = write_tree(tmp_path, mrv2=mrv2)
    assert judge.native_reason(SourceReader(root=root)) is None


def test_an_assert_at_the_replay_is_not_the_fix(tmp_path: Path) -> None:
    root = write_tree(tmp_path, check=ASSERTS)
    assert judge.native_reason(SourceReader(root=root)) is None


@pytest.mark.parametrize("mrv2", [False, True])
def test_the_backported_tree_reads_as_native(tmp_path: Path, mrv2: bool) -> None:
    root = backported(write_tree(tmp_path, mrv2=mrv2))
    reason = judge.native_reason(SourceReader(root=root))
    assert reason is not None and "without the FULL graph" in reason


def test_the_backport_rebinds_the_steps_descriptor_before_its_replay(
    tmp_path: Path,
) -> None:
    root = backported(write_tree(tmp_path, mrv2=True))
    runner = (root / "vllm/v1/worker/gpu/model_runner.py").read_text()
    rebind = runner.index("batch_desc = graphsafe_leave_decode_graph_for_prefill(")
    assert rebind < runner.index("if batch_desc.cg_mode == CUDAGraphMode.FULL:")
    assert "    graphsafe_leave_decode_graph_for_prefill,\n)" in runner
    wrapper = (root / "vllm/compilation/cuda_graph.py").read_text()
    assert "def graphsafe_attn_metadata_has_prefill(" in wrapper
    assert "forward_context.cudagraph_runtime_mode = CUDAGraphMode.NONE" in wrapper


def test_only_the_v1_half_backported_is_not_native(tmp_path: Path) -> None:
    """With Model Runner V2 in the tree, its replay must fall back too."""
    root = backported(write_tree(tmp_path / "v1", mrv2=False))
    mixed = write_tree(tmp_path / "mixed", mrv2=True)
    wrapper = "vllm/compilation/cuda_graph.py"
    (mixed / wrapper).write_text((root / wrapper).read_text(), encoding="utf-8")
    assert judge.native_reason(SourceReader(root=mixed)) is None
