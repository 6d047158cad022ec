"""Reading the code, the fallback where a fix's cases cannot run.

Each case is a synthetic vLLM tree (``SourceReader(root=...)``) whose code the
cases cannot run (no graph dispatcher, no runnable dummy run). Sources that
name the generic state for other reasons (a comment, a log string, an
unrelated use) read as no fix; sources with the fix's shape read as the fix,
said so in the evidence, but the verdict stays ``needed``: reading alone
cannot tell a fix from a look-alike spelled like one.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vllm_graphsafe import fixes
from vllm_graphsafe.behaviour.judgement import READING
from vllm_graphsafe.judging import PatchState, judge
from vllm_graphsafe.registry import Patch
from vllm_graphsafe.settings import read_settings
from vllm_graphsafe.sources import SourceReader

INPUT_BATCH = """
class InputBatch:
    def __init__(self):
        self.num_computed_tokens_cpu = None
        self.num_prompt_tokens = None
        self.spec_token_ids = []
"""
CP_UTILS = """
def prepare_dcp_dummy_context_metadata(
    *, input_batch, kv_cache_config, query_pos, positions, query_start_loc,
    num_reqs, num_tokens_unpadded, dcp_dummy_context_len,
):
    return None
"""
WORKER = """
class Worker:
    def execute_model(self, scheduler_output):
        return self.model_runner.execute_model(scheduler_output)
"""
RUNNER = """
from vllm.v1.worker.cp_utils import prepare_dcp_dummy_context_metadata


class GPUModelRunner:
    def __init__(self):
        self.input_batch = None
        self.num_decode_draft_tokens = None
        self.optimistic_seq_lens_cpu = None
        self.seq_lens = None

    @staticmethod
    def _is_uniform_decode(
        max_num_scheduled_tokens, uniform_decode_query_len, num_tokens, num_reqs,
        force_uniform_decode=None,
    ):
        {SHAPE}
        return max_num_scheduled_tokens == uniform_decode_query_len

    def _allow_microbatching(self, num_reqs):
        {HELPER}
        return True

    def _determine_batch_execution_and_padding(self, num_tokens, num_reqs):
        {DISPATCH}
        uniform = self._is_uniform_decode(1, 1, num_tokens, num_reqs)
        return self._allow_microbatching(num_reqs), uniform

    def _stage_dummy(self, num_tokens):
        {STAGE}
        return None

    def _dummy_run(self, num_tokens):
        {DUMMY}
        self._stage_dummy(num_tokens)
        prepare_dcp_dummy_context_metadata(positions=self.positions)
"""
SLOTS = ("SHAPE", "HELPER", "DISPATCH", "STAGE", "DUMMY")


def tree(tmp_path: Path, **code: str) -> SourceReader:
    runner = RUNNER
    for slot in SLOTS:
        runner = runner.replace("{" + slot + "}", code.get(slot, "pass"))
    files = {
        "gpu_model_runner.py": runner,
        "gpu_input_batch.py": INPUT_BATCH,
        "cp_utils.py": CP_UTILS,
        "gpu_worker.py": WORKER,
        "__init__.py": "",
    }
    worker = tmp_path / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    for name, text in files.items():
        (worker / name).write_text(textwrap.dedent(text))
    return SourceReader(root=tmp_path)


def V1PhaseDispatchPatch() -> Patch:
    return Patch(fixes.get("v1-phase-dispatch"))


def V1DummyStagingPatch() -> Patch:
    return Patch(fixes.get("v1-dummy-staging"))


def decide(patch: Patch, sources: SourceReader) -> Patch:
    patch.decide(read_settings({}), judge(patch.fix, sources))
    return patch


MENTIONS_PHASE = {
    "comment": (
        "DISPATCH",
        "# TODO: compare num_computed_tokens with num_prompt_tokens",
    ),
    "log-string": (
        "SHAPE",
        'logger.debug("num_computed_tokens_cpu < num_prompt_tokens unchecked")',
    ),
    "unrelated-use": (
        "HELPER",
        "computed = self.input_batch.num_computed_tokens_cpu[:num_reqs] > 0",
    ),
    "separate-compares": (
        "DISPATCH",
        "a = self.input_batch.num_computed_tokens_cpu > 0\n"
        "        b = self.input_batch.num_prompt_tokens > 0",
    ),
}
FIXES_PHASE = {
    "in-the-dispatch": (
        "DISPATCH",
        "pending = (self.input_batch.num_computed_tokens_cpu[:num_reqs]"
        " < self.input_batch.num_prompt_tokens[:num_reqs]).any()",
    ),
    "in-a-helper-the-dispatch-calls": (
        "HELPER",
        "done = self.input_batch.num_prompt_tokens <= "
        "self.input_batch.num_computed_tokens_cpu",
    ),
    "draft-counts-against-the-query-length": (
        "HELPER",
        "mixed = (self.num_decode_draft_tokens.np[:num_reqs]"
        " != self.uniform_decode_query_len - 1).any()",
    ),
}


@pytest.mark.parametrize("case", sorted(MENTIONS_PHASE))
def test_v1_dispatch_that_only_mentions_phase_state_is_patched(
    case: str, tmp_path: Path
) -> None:
    slot, code = MENTIONS_PHASE[case]
    patch = decide(V1PhaseDispatchPatch(), tree(tmp_path, **{slot: code}))
    assert patch.state is PatchState.APPLIED, patch.reason


def assert_read_but_unconfirmed(patch: Patch, found: str) -> None:
    """Where the fix's cases cannot run (these dispatches consult no graph
    dispatcher), what reading finds is said, and the verdict stays needed."""
    assert patch.state is PatchState.APPLIED, patch.reason
    evidence = patch.evidence
    assert evidence is not None and evidence.how == READING, evidence
    assert evidence.reading is not None and found in evidence.reading, evidence
    assert "unconfirmed" in evidence.reading and evidence.could_not_run, evidence
    assert not evidence.native


@pytest.mark.parametrize("case", sorted(FIXES_PHASE))
def test_v1_dispatch_that_compares_computed_with_prompt_is_read_but_not_native(
    case: str, tmp_path: Path
) -> None:
    slot, code = FIXES_PHASE[case]
    patch = decide(V1PhaseDispatchPatch(), tree(tmp_path, **{slot: code}))
    assert_read_but_unconfirmed(patch, "compares")


MENTIONS_STAGING = {
    "comment": ("DUMMY", "# self.positions[:n] = num_computed_tokens_cpu[:n]"),
    "reads-only": (
        "DUMMY",
        "x = self.input_batch.num_computed_tokens_cpu[:1] + self.positions[:1]",
    ),
    "positions-only": ("DUMMY", "self.positions[:num_tokens] = 0"),
    "split-across-methods": (
        "STAGE",
        "self.input_batch.num_computed_tokens_cpu[:1] = 0",
    ),
}
FIXES_STAGING = {
    "in-dummy-run": (
        "DUMMY",
        "self.input_batch.num_computed_tokens_cpu[:1] = 0\n"
        "        self.positions[:num_tokens] = 0",
    ),
    "copy-in-a-helper": (
        "STAGE",
        "self.input_batch.num_computed_tokens_cpu[:1] = 0\n"
        "        self.positions.gpu[:num_tokens].copy_(self.staged)",
    ),
}


@pytest.mark.parametrize("case", sorted(MENTIONS_STAGING))
def test_dummy_run_that_only_mentions_the_staging_is_patched(
    case: str, tmp_path: Path
) -> None:
    slot, code = MENTIONS_STAGING[case]
    patch = decide(V1DummyStagingPatch(), tree(tmp_path, **{slot: code}))
    assert patch.state is PatchState.APPLIED, patch.reason


@pytest.mark.parametrize("case", sorted(FIXES_STAGING))
def test_dummy_run_that_stages_computed_and_positions_is_read_but_not_native(
    case: str, tmp_path: Path
) -> None:
    slot, code = FIXES_STAGING[case]
    patch = decide(V1DummyStagingPatch(), tree(tmp_path, **{slot: code}))
    assert_read_but_unconfirmed(patch, "stages computed lengths and positions")


def test_a_helper_whose_parameter_was_renamed_fails_at_bind(tmp_path: Path) -> None:
    sources = tree(tmp_path)
    helper = tmp_path / "vllm" / "v1" / "worker" / "cp_utils.py"
    helper.write_text(helper.read_text().replace("positions,", "token_positions,"))
    patch = decide(V1DummyStagingPatch(), SourceReader(root=tmp_path))
    assert sources is not None
    assert patch.state is PatchState.FAILED
    assert "positions" in patch.reason and "read by" in patch.reason


def test_a_runner_without_draft_counts_fails_at_bind(tmp_path: Path) -> None:
    tree(tmp_path)
    runner = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    runner.write_text(
        runner.read_text().replace("num_decode_draft_tokens", "decode_drafts")
    )
    patch = decide(V1PhaseDispatchPatch(), SourceReader(root=tmp_path))
    assert patch.state is PatchState.FAILED
    assert "num_decode_draft_tokens" in patch.reason
