"""Model Runner V2's real dispatch code, on batches whose shape hides a prefill.

The target runner's ``execute_model`` and the speculators' ``propose`` of the
installed release run on CPU with just enough state (``mrv2_state``) until they
call ``dispatch_cg_and_sync_dp``; the tests check the uniform token count that
reaches it (and, with DP, the count the DP sync inside it receives).

The expectation is derived from the batch alone: a uniform batch of width W
keeps count W only when no scheduled request is still in prefill. A release
whose attention metadata runs "one new prompt token over existing context" as
a decode (0.28+: ``prefill_runs_as_decode_np``) may count such a row as decode.

0.20.2, 0.22.1 and 0.27.1 classify by shape: with the plugin every case passes;
with ``VLLM_GRAPHSAFE_DISABLE=all`` every case marked ``regression`` fails.
0.20's input batch has no phase column: its draft-prefill cases run the
release's real order (``any_prefills`` before the forward, ``postprocess``
advancing the request states, then ``propose``), so a count read from the
request states as ``propose`` finds them would fail them.
0.32.0 classifies by phase natively (vllm-project/vllm#51865): everything
passes either way, and the patch reports ``native``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.vllm_fakes import mrv2_speculators, mrv2_state
from tests.support.vllm_fakes.mrv2_speculators import (
    Tripwire,
    make_speculator,
    propose,
)
from tests.support.vllm_fakes.mrv2_state import (
    DispatchRecorder,
    GraphManagerRecord,
    Req,
    dummy_input_batch,
    dummy_scheduler_output,
    input_batch,
    make_step,
)
from vllm_graphsafe import counts, vllm_layout
from vllm_graphsafe.fixes import phase_events
from vllm_graphsafe.hook_points import HookPoint, is_hooked
from vllm_graphsafe.judging import PatchState
from vllm_graphsafe.settings import read_settings
from vllm_graphsafe.sources import SourceReader

PATCH_ID = "mrv2-phase-dispatch"
WIDTHS = [1, 3, 4, 5, 7, 8, 16]
RUNNER_MODULE = mrv2_state.RUNNER_MODULE
STATES_MODULE = vllm_layout.MRV2_STATES


@pytest.fixture(scope="module", autouse=True)
def plugin_applied() -> None:
    """Apply the plugin as vLLM does; VLLM_GRAPHSAFE_DISABLE turns it off."""
    from vllm_graphsafe.plugin import register

    register()


def the_patch() -> Any:
    from vllm_graphsafe.plugin import registry

    return registry().get(PATCH_ID)


# -- batches -------------------------------------------------------------------
# Each scenario maps a query width w to the step's requests (and whether they
# sit on non-contiguous state rows). Decodes schedule 1 + (w - 1) drafts.


def _decodes(w: int, n: int = 3, prefix: str = "decode") -> dict[str, Req]:
    return {
        f"{prefix}-{i}": Req(
            prefill_len=20 + i,
            computed=30 + 5 * i,
            scheduled=w,
            drafts=w - 1,
            previous=29 + 5 * i,
        )
        for i in range(n)
    }


def fresh_prompts(w: int) -> dict[str, Req]:
    return {f"new-{i}": Req(w, 0, w, new=True) for i in range(3)}


def chunked_tails(w: int) -> dict[str, Req]:
    return {
        "tail-0": Req(512 + w, 512, w, previous=256),
        "tail-1": Req(96 + w, 96, w, previous=0),
    }


def mixed(w: int) -> dict[str, Req]:
    return {**_decodes(w), "new": Req(w, 0, w, new=True)}


def all_decode(w: int) -> dict[str, Req]:
    return _decodes(w, n=4)


def fully_computed(w: int) -> dict[str, Req]:
    # The prompts' last chunks ran in the previous step: before this step's
    # state update the runner still has them in prefill, after it they are done.
    return {
        f"done-{i}": Req(40 + i, 40 + i, w, drafts=w - 1, previous=32) for i in range(2)
    }


def noncontiguous_prefill(w: int) -> dict[str, Req]:
    return {**_decodes(w, n=2), "new": Req(w, 0, w, new=True)}


def noncontiguous_decode(w: int) -> dict[str, Req]:
    return _decodes(w, n=4)


def unscheduled_prefill(w: int) -> dict[str, Req]:
    # A long prompt mid-prefill that the scheduler left out of this step.
    return {**_decodes(w), "waiting": Req(300, 128, 0, previous=64)}


Scenario = Callable[[int], dict[str, Req]]
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "fresh_prompts": (fresh_prompts, False),
    "chunked_tails": (chunked_tails, False),
    "mixed": (mixed, False),
    "all_decode": (all_decode, False),
    "fully_computed": (fully_computed, False),
    "noncontiguous_prefill": (noncontiguous_prefill, True),
    "noncontiguous_decode": (noncontiguous_decode, True),
    "unscheduled_prefill": (unscheduled_prefill, False),
}
DP_SCENARIOS = ["fresh_prompts", "chunked_tails", "mixed", "all_decode"]


def scheduled(reqs: dict[str, Req]) -> list[Req]:
    return [req for req in reqs.values() if req.scheduled > 0]


def hides_prefill(reqs: dict[str, Req]) -> bool:
    """A uniform shape with a scheduled prefill: what the fix is about."""
    rows = scheduled(reqs)
    return len({r.scheduled for r in rows}) == 1 and any(r.in_prefill for r in rows)


@dataclasses.dataclass(frozen=True)
class Release:
    #: Its metadata runs a one-new-token prompt row over context as a decode.
    one_token_extension_runs_as_decode: bool
    #: Its runner gathers the batch's request state before dispatch (0.28+).
    gathers_batch_state_before_dispatch: bool


def release() -> Release:
    InputBatch = vllm_layout.load(vllm_layout.MRV2_INPUT_BATCH).InputBatch
    GPUModelRunner = vllm_layout.load(vllm_layout.MRV2_RUNNER).GPUModelRunner

    names = {f.name for f in dataclasses.fields(InputBatch)}
    return Release(
        one_token_extension_runs_as_decode="prefill_runs_as_decode_np" in names,
        gathers_batch_state_before_dispatch=hasattr(
            GPUModelRunner, "gather_batch_req_state"
        ),
    )


def expected_count(reqs: dict[str, Req], width: int) -> int | None:
    rows = scheduled(reqs)
    if any(r.scheduled != width for r in rows):
        return None
    prefill = [r for r in rows if r.in_prefill]
    if not prefill:
        return width
    if release().one_token_extension_runs_as_decode and all(
        r.scheduled - r.drafts == 1 and r.computed > 0 for r in prefill
    ):
        return width
    return None


def scenario_params(names: list[str], widths: list[int]) -> list[Any]:
    params = []
    for name in names:
        for width in widths:
            marks = (
                [pytest.mark.regression(PATCH_ID)]
                if hides_prefill(SCENARIOS[name][0](width))
                else []
            )
            params.append(pytest.param(name, width, marks=marks, id=f"{name}-w{width}"))
    return params


def run_execute_model(step: Any, *, dummy_run: bool = False) -> None:
    try:
        step.runner.execute_model(step.scheduler_output, dummy_run=dummy_run)
    except mrv2_state.ReachedDispatch:
        return
    raise AssertionError("execute_model returned before its dispatch was recorded")


@pytest.fixture
def target_dispatch(monkeypatch: pytest.MonkeyPatch) -> DispatchRecorder:
    module = importlib.import_module(RUNNER_MODULE)
    recorder = DispatchRecorder(module.dispatch_cg_and_sync_dp)
    monkeypatch.setattr(module, "dispatch_cg_and_sync_dp", recorder)
    return recorder


# -- target dispatch -----------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "width"), scenario_params(list(SCENARIOS), WIDTHS)
)
def test_target_dispatch_receives_the_phase_aware_count(
    scenario: str, width: int, target_dispatch: DispatchRecorder
) -> None:
    make_reqs, gaps = SCENARIOS[scenario]
    reqs = make_reqs(width)
    step = make_step(reqs, decode_query_len=width, gaps=gaps)

    run_execute_model(step)

    if gaps:
        rows = sorted(step.rows()[rid] for rid, r in reqs.items() if r.scheduled)
        assert rows != list(range(rows[0], rows[0] + len(rows))), "rows are contiguous"
    assert target_dispatch.counts == [expected_count(reqs, width)]


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize("width", [1, 4])
def test_consecutive_steps_read_the_request_states_as_they_are_now(
    width: int, target_dispatch: DispatchRecorder
) -> None:
    """One runner over three steps: decodes, a prompt joins, its prompt done."""
    reqs = _decodes(width)
    step = make_step(reqs, decode_query_len=width)
    expected = []

    def run(step_reqs: dict[str, Req]) -> None:
        step.reqs = step_reqs
        step.scheduler_output = mrv2_state.scheduler_output(step_reqs)
        run_execute_model(step)
        expected.append(expected_count(step_reqs, width))

    run(reqs)
    run({**reqs, "joined": Req(width, 0, width, new=True)})
    # The runner's post-step update records the joined prompt as computed.
    state = step.runner.req_states
    state.num_computed_prefill_tokens[state.req_id_to_index["joined"]] = width
    run({**reqs, "joined": Req(width, width, width, drafts=width - 1)})

    assert expected == [width, None, width]
    assert target_dispatch.counts == expected


@pytest.mark.parametrize("width", WIDTHS)
def test_dummy_capture_keeps_the_shape_rule(
    width: int, target_dispatch: DispatchRecorder
) -> None:
    # Prefills in flight must not matter to a capture/profile batch.
    step = make_step({**chunked_tails(width), **fresh_prompts(width)}, width)
    step.run_state_update()
    step.scheduler_output = dummy_scheduler_output(4, width)
    step.runner.req_states.reads = []

    run_execute_model(step, dummy_run=True)

    assert target_dispatch.counts == [width]
    assert step.runner.req_states.reads == []


NON_UNIFORM_SHAPES: dict[str, Scenario] = {
    "decodes_and_a_longer_prefill": lambda w: {
        **_decodes(w),
        "long": Req(64, 0, w + 1, new=True),
    },
    "decodes_and_a_wide_chunk": lambda w: {
        **_decodes(w, n=2),
        "chunk": Req(900, 100, 2 * w + 1, previous=100),
    },
}


@pytest.mark.parametrize("shape", sorted(NON_UNIFORM_SHAPES))
@pytest.mark.parametrize("width", WIDTHS)
def test_non_uniform_batches_skip_the_request_state_scan(
    shape: str, width: int, target_dispatch: DispatchRecorder
) -> None:
    step = make_step(NON_UNIFORM_SHAPES[shape](width), width)
    runner = step.runner
    update = type(runner).update_requests

    def update_then_record(scheduler_output: Any) -> None:
        update(runner, scheduler_output)
        runner.req_states.reads = []

    runner.update_requests = update_then_record

    run_execute_model(step)

    assert target_dispatch.counts == [None]
    # Nothing scans the phase columns for a non-uniform shape. A release that
    # gathers the batch's request state for its inputs before dispatch reads
    # each column exactly once, for that gather, and no more.
    reads = Counter(runner.req_states.reads)
    if release().gathers_batch_state_before_dispatch:
        assert reads == Counter(mrv2_state.PHASE_FIELDS)
    else:
        assert reads == Counter()


@pytest.mark.parametrize(("scenario", "width"), scenario_params(DP_SCENARIOS, WIDTHS))
def test_dp_sync_receives_the_phase_aware_count(
    scenario: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    dp_utils = importlib.import_module(mrv2_state.DP_MODULE)
    sync = DispatchRecorder(dp_utils.sync_cudagraph_and_dp_padding)
    monkeypatch.setattr(dp_utils, "sync_cudagraph_and_dp_padding", sync)
    graphs = GraphManagerRecord()
    reqs = SCENARIOS[scenario][0](width)
    step = make_step(reqs, width, dp_size=2, dp_rank=1, graph_record=graphs)

    run_execute_model(step)

    expected = expected_count(reqs, width)
    assert graphs.dispatched == [expected]
    assert sync.counts == [expected]
    assert (sync.calls[0]["dp_size"], sync.calls[0]["dp_rank"]) == (2, 1)


# -- draft prefill -------------------------------------------------------------

SPECULATORS = list(mrv2_speculators.speculator_classes())
SPECULATOR_IDS = [name for _, name in SPECULATORS]
DRAFT_SCENARIOS = [name for name in SCENARIOS if name != "unscheduled_prefill"]


def draft_step(reqs: dict[str, Req], width: int, gaps: bool = False) -> Any:
    return make_step(reqs, decode_query_len=max(width, 2), gaps=gaps)


@pytest.mark.parametrize("speculator", SPECULATORS, ids=SPECULATOR_IDS)
@pytest.mark.parametrize(
    ("scenario", "width"), scenario_params(DRAFT_SCENARIOS, WIDTHS)
)
def test_draft_prefill_dispatch_receives_the_phase_aware_count(
    speculator: tuple[str, str],
    scenario: str,
    width: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_reqs, gaps = SCENARIOS[scenario]
    reqs = make_reqs(width)
    batch = input_batch(draft_step(reqs, width, gaps))
    drafter, dispatch = make_speculator(*speculator, max(width - 1, 1), monkeypatch)

    propose(drafter, batch)

    assert dispatch.counts == [expected_count(reqs, width)]


@pytest.mark.parametrize("speculator", SPECULATORS, ids=SPECULATOR_IDS)
@pytest.mark.parametrize("width", WIDTHS)
def test_draft_dummy_capture_keeps_the_shape_rule(
    speculator: tuple[str, str], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    drafter, dispatch = make_speculator(*speculator, max(width - 1, 1), monkeypatch)

    propose(drafter, dummy_input_batch(4, width), dummy_run=True)

    assert dispatch.counts == [width]


@pytest.mark.parametrize("speculator", SPECULATORS, ids=SPECULATOR_IDS)
@pytest.mark.parametrize("shape", sorted(NON_UNIFORM_SHAPES))
@pytest.mark.parametrize("width", WIDTHS)
def test_draft_non_uniform_batches_skip_the_scan(
    speculator: tuple[str, str],
    shape: str,
    width: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    columns = ("prefill_len_np", "num_computed_prefill_tokens_np", "is_prefilling_np")
    batch = input_batch(
        draft_step(NON_UNIFORM_SHAPES[shape](width), width),
        **{name: Tripwire(name) for name in columns},
    )
    drafter, dispatch = make_speculator(*speculator, max(width - 1, 1), monkeypatch)

    propose(drafter, batch)

    assert dispatch.counts == [None]


MULTI_STEP_SPECULATORS = [
    spec for spec in SPECULATORS if mrv2_speculators.dispatches_in_propose(*spec) >= 2
]


@pytest.mark.regression(PATCH_ID)
@pytest.mark.parametrize(
    "speculator", MULTI_STEP_SPECULATORS, ids=[n for _, n in MULTI_STEP_SPECULATORS]
)
@pytest.mark.parametrize("width", [w for w in WIDTHS if w >= 3])
def test_draft_decode_steps_keep_their_width_one_count(
    speculator: tuple[str, str], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    reqs = fresh_prompts(width)
    batch = input_batch(draft_step(reqs, width))
    drafter, dispatch = make_speculator(*speculator, width - 1, monkeypatch, stop_at=2)

    propose(drafter, batch)

    assert dispatch.counts == [None, 1]


@pytest.mark.parametrize("speculator", SPECULATORS, ids=SPECULATOR_IDS)
@pytest.mark.parametrize(
    ("scenario", "width"), scenario_params(["fresh_prompts", "all_decode"], WIDTHS)
)
def test_draft_dp_dispatch_receives_the_phase_aware_count(
    speculator: tuple[str, str],
    scenario: str,
    width: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reqs = SCENARIOS[scenario][0](width)
    batch = input_batch(draft_step(reqs, width))
    drafter, dispatch = make_speculator(
        *speculator, max(width - 1, 1), monkeypatch, dp_size=2, dp_rank=1
    )

    propose(drafter, batch)

    assert dispatch.counts == [expected_count(reqs, width)]
    assert (dispatch.calls[0]["dp_size"], dispatch.calls[0]["dp_rank"]) == (2, 1)


# -- the patch's own state -----------------------------------------------------


def test_the_release_has_draft_prefill_speculators() -> None:
    assert SPECULATORS, "no speculator of this release computes a draft-prefill count"


def test_patch_state_follows_the_release_code() -> None:
    patch = the_patch()
    if read_settings().is_disabled(PATCH_ID):
        assert patch.state is PatchState.DISABLED
    elif patch.parts().native_reason(SourceReader()) is not None:
        assert patch.state is PatchState.NATIVE
    else:
        assert patch.state is PatchState.APPLIED, patch.reason


def _installed_version() -> str:
    import vllm

    version: str = vllm.__version__
    return version


@pytest.mark.parametrize("version", [_installed_version()])
def test_phase_aware_release_code_is_recognised_native(version: str) -> None:
    # Upstream's fix (vllm-project/vllm#51865) was first released in 0.28.
    major, minor = (int(part) for part in version.split(".")[:2])
    has_upstream_fix = (major, minor) >= (0, 28)

    reason = the_patch().parts().native_reason(SourceReader())

    assert (reason is not None) == has_upstream_fix, reason


def _resolve(hook: HookPoint) -> Any:
    module = importlib.import_module(hook.module)
    *parents, leaf = hook.qualname.split(".")
    owner: Any = module
    for name in parents:
        owner = getattr(owner, name)
    return vars(owner)[leaf] if isinstance(owner, type) else getattr(owner, leaf)


def test_hooks_are_wrapped_once_their_modules_are_imported() -> None:
    patch = the_patch()
    if patch.state is PatchState.APPLIED:
        hooks = patch.hook_points()
        bare = [h.symbol for h in hooks if not is_hooked(_resolve(h))]
        assert bare == []
    else:
        runner = importlib.import_module(RUNNER_MODULE).GPUModelRunner
        assert not is_hooked(vars(runner)["execute_model"])


def test_hook_points_cover_the_release_shape_only_speculators() -> None:
    sources = SourceReader()
    hooked = {hook.module for hook in the_patch().hook_points()} - {RUNNER_MODULE}
    shape_only = {
        module
        for module, name in SPECULATORS
        if "get_uniform_token_count("
        in (sources.function(module, f"{name}.propose") or "")
    }
    assert shape_only <= hooked
    assert all(sources.exists(module) for module in hooked)


def test_decisions_are_counted_in_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(RUNNER_MODULE)
    counts.STATS.reset()
    for reqs, dummy in [
        (fresh_prompts(4), False),
        (all_decode(4), False),
        (NON_UNIFORM_SHAPES["decodes_and_a_longer_prefill"](4), False),
        (all_decode(4), True),
    ]:
        monkeypatch.setattr(
            module,
            "dispatch_cg_and_sync_dp",
            DispatchRecorder(module.dispatch_cg_and_sync_dp),
        )
        run_execute_model(make_step(reqs, 4), dummy_run=dummy)
        monkeypatch.undo()

    decided = counts.STATS.snapshot().get(PATCH_ID, {})
    if the_patch().state is PatchState.APPLIED:
        assert decided == {
            phase_events.KEPT_OFF_DECODE: 1,
            phase_events.UNIFORM_DECODE: 1,
            phase_events.NON_UNIFORM: 1,
            phase_events.DUMMY: 1,
        }
    else:
        assert decided == {}


# -- layouts, judged by source text ---------------------------------------------

_SPEC = vllm_layout.MRV2_SPEC_DECODE
_RUNNER_SOURCE = """
from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_token_count


class GPUModelRunner:
    def __init__(self):
        self.req_states = None

    def execute_model(self, scheduler_output, dummy_run=False):
        count = get_uniform_token_count(1, 1, 1)
        return dispatch_cg_and_sync_dp(count)
"""
_NATIVE_RUNNER_SOURCE = """
class GPUModelRunner:
    def execute_model(self, scheduler_output, dummy_run=False):
        state, count = self.gather_batch_req_state(scheduler_output, dummy_run)
        return dispatch_cg_and_sync_dp(count)
"""


def _speculator_source(name: str, shape_rule: bool = True) -> str:
    call = "get_uniform_token_count(1, 1, 1)" if shape_rule else "None"
    return (
        (
            "from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_token_count\n"
            if shape_rule
            else ""
        )
        + f"""

class {name}:
    def propose(self, input_batch, dummy_run=False):
        uniform_token_count = {call}
        return dispatch_cg_and_sync_dp(uniform_token_count)
"""
    )


class FakeSources(SourceReader):
    def __init__(self, texts: dict[str, str]) -> None:
        super().__init__()
        self._texts = dict(texts)

    def text(self, module: str) -> str | None:
        return self._texts.get(module)


_STATE_SOURCES = {
    vllm_layout.MRV2_STATES: """
class RequestState:
    def __init__(self):
        self.num_computed_prefill_tokens = None
        self.prefill_len = None
        self.req_id_to_index = {}
""",
    vllm_layout.MRV2_INPUT_BATCH: """
class InputBatch:
    num_reqs: int
    is_prefilling_np: object
""",
}


def decided(texts: dict[str, str]) -> Any:
    from vllm_graphsafe import fixes
    from vllm_graphsafe.registry import Patch

    if texts:
        texts = {**_STATE_SOURCES, **texts}
    patch = Patch(fixes.get(PATCH_ID))
    patch.decide(read_settings({}), patch.judge(FakeSources(texts)))
    return patch


AR = f"{_SPEC}.autoregressive.speculator"
MMTP = f"{_SPEC}.multi_module_mtp.speculator"
EAGLE = f"{_SPEC}.eagle.speculator"


def test_a_release_without_a_speculator_module_still_applies() -> None:
    patch = decided(
        {
            RUNNER_MODULE: _RUNNER_SOURCE,
            AR: _speculator_source("AutoRegressiveSpeculator"),
            EAGLE: "class EagleSpeculator(AutoRegressiveSpeculator):\n    pass\n",
        }
    )

    assert patch.state is PatchState.APPLIED, patch.reason
    assert patch.hook_modules() == sorted({RUNNER_MODULE, AR})


def test_the_pre_split_layout_hooks_the_eagle_speculator() -> None:
    patch = decided(
        {
            RUNNER_MODULE: _RUNNER_SOURCE,
            EAGLE: _speculator_source("EagleSpeculator"),
        }
    )

    assert patch.state is PatchState.APPLIED, patch.reason
    assert patch.hook_modules() == sorted({RUNNER_MODULE, EAGLE})


@pytest.mark.parametrize(
    ("texts", "symbol"),
    [
        pytest.param(
            {
                RUNNER_MODULE: _RUNNER_SOURCE,
                AR: _speculator_source("AutoRegressiveSpeculator"),
                MMTP: _speculator_source("MultiModuleMTPSpeculator", shape_rule=False),
            },
            f"{MMTP}.get_uniform_token_count",
            id="speculator-lacks-the-shape-rule",
        ),
        pytest.param(
            {
                RUNNER_MODULE: _RUNNER_SOURCE,
                AR: _speculator_source("AutoRegressiveSpeculator").replace(
                    "def propose(", "def draft("
                ),
            },
            f"{AR}.AutoRegressiveSpeculator.propose",
            id="speculator-lacks-propose",
        ),
        pytest.param(
            {RUNNER_MODULE: _RUNNER_SOURCE.replace("get_uniform_token_count", "shape")},
            f"{RUNNER_MODULE}.get_uniform_token_count",
            id="runner-lacks-the-shape-rule",
        ),
    ],
)
def test_a_present_module_without_its_hook_point_fails_naming_it(
    texts: dict[str, str], symbol: str
) -> None:
    patch = decided(texts)

    assert patch.state is PatchState.FAILED
    assert symbol in patch.reason


_PRE_STEP_RUNNER_SOURCE = (
    _RUNNER_SOURCE
    + """
    def prepare_inputs(self, scheduler_output, batch_desc):
        idx_mapping_np = None
        if self.req_states.any_prefills(idx_mapping_np):
            pass
        return InputBatch(idx_mapping_np=idx_mapping_np)
"""
)
#: 0.20's layout: no phase column in the batch, any_prefills asked pre-step.
_PRE_STEP_SOURCES = {
    RUNNER_MODULE: _PRE_STEP_RUNNER_SOURCE,
    EAGLE: _speculator_source("EagleSpeculator"),
    STATES_MODULE: _STATE_SOURCES[STATES_MODULE]
    + """
    def any_prefills(self, idx_mapping_np):
        return False
""",
    vllm_layout.MRV2_INPUT_BATCH: """
class InputBatch:
    num_reqs: int
    idx_mapping_np: object
""",
}


def test_a_batch_without_phase_column_hooks_the_pre_step_question() -> None:
    patch = decided(_PRE_STEP_SOURCES)

    assert patch.state is PatchState.APPLIED, patch.reason
    assert patch.hook_modules() == sorted({RUNNER_MODULE, EAGLE, STATES_MODULE})
    assert f"{STATES_MODULE}.RequestState.any_prefills" in {
        hook.symbol for hook in patch.hook_points()
    }


@pytest.mark.parametrize(
    ("module", "old", "new", "named"),
    [
        pytest.param(
            vllm_layout.MRV2_INPUT_BATCH,
            "idx_mapping_np",
            "idx_mapping_v2",
            "idx_mapping_np",
            id="batch-renames-idx_mapping_np",
        ),
        pytest.param(
            STATES_MODULE,
            "def any_prefills(self, idx_mapping_np)",
            "def any_prefills(self, rows)",
            "idx_mapping_np",
            id="any_prefills-renames-its-parameter",
        ),
        pytest.param(
            RUNNER_MODULE,
            "self.req_states.any_prefills(idx_mapping_np)",
            "self.req_states.has_prefills(idx_mapping_np)",
            "is_prefilling_np",
            id="prepare_inputs-stops-asking-any_prefills",
        ),
    ],
)
def test_the_pre_step_layout_drifting_fails_at_bind_naming_it(
    module: str, old: str, new: str, named: str
) -> None:
    texts = dict(_PRE_STEP_SOURCES)
    assert old in texts[module]
    texts[module] = texts[module].replace(old, new)

    patch = decided(texts)

    assert patch.state is PatchState.FAILED
    assert named in patch.reason


def test_a_batch_with_its_phase_column_ignores_any_prefills() -> None:
    texts = {
        **_PRE_STEP_SOURCES,
        vllm_layout.MRV2_INPUT_BATCH: _STATE_SOURCES[vllm_layout.MRV2_INPUT_BATCH],
    }

    patch = decided(texts)

    assert patch.state is PatchState.APPLIED, patch.reason
    assert patch.hook_modules() == sorted({RUNNER_MODULE, EAGLE})


def test_code_that_only_names_upstreams_helper_is_read_but_not_native() -> None:
    """The helper is not there to run: reading finds upstream's name, and a
    name alone is never native (a look-alike can carry it)."""
    patch = decided({RUNNER_MODULE: _NATIVE_RUNNER_SOURCE})

    assert patch.state is not PatchState.NATIVE
    evidence = patch.evidence
    assert evidence is not None and evidence.how == "reading"
    assert evidence.reading is not None
    assert "gather_batch_req_state" in evidence.reading
    assert "unconfirmed" in evidence.reading


def test_no_model_runner_v2_is_not_applicable() -> None:
    assert decided({}).state is PatchState.NOT_APPLICABLE


# -- fixed-width speculators ------------------------------------------------------

FIXED_WIDTH_SPECULATORS = [
    (f"{_SPEC}.{package}.speculator", name)
    for package, name in (
        ("dflash", "DFlashSpeculator"),
        ("dflash2", "DFlash2Speculator"),
    )
]


def test_fixed_width_speculators_are_left_alone() -> None:
    """DFlash drafts a fixed-width block: no draft prefill to classify, no hook."""
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.judge import DRAFT_PREFILL_DISPATCHERS

    sources = SourceReader()
    present = [(m, n) for m, n in FIXED_WIDTH_SPECULATORS if sources.exists(m)]
    hooked_modules = {hook.module for hook in the_patch().hook_points()}

    # Only the speculators known to classify a draft prefill by shape are hooked
    # (and, in 0.20, the request states' pre-step question).
    assert hooked_modules <= {RUNNER_MODULE, STATES_MODULE} | {
        dispatcher.module for dispatcher in DRAFT_PREFILL_DISPATCHERS
    }
    # Releases before 0.24 have no DFlash: nothing more to check there.
    for module_name, class_name in present:
        assert module_name not in hooked_modules
        module = importlib.import_module(module_name)
        propose = vars(getattr(module, class_name)).get("propose")
        assert propose is None or not is_hooked(propose)
        assert not is_hooked(getattr(module, "get_uniform_token_count", None))


# -- failing open ---------------------------------------------------------------------


@pytest.fixture
def applied_patch() -> Any:
    """The session's patch, applied; re-applied after a test made it fail."""
    from vllm_graphsafe.plugin import registry

    patch = the_patch()
    if patch.state is not PatchState.APPLIED:
        pytest.skip(f"{PATCH_ID} is {patch.state} here (native or switched off)")
    yield patch
    patch._failed_at_run_time = False
    registry().apply_all()
    assert patch.state is PatchState.APPLIED


@pytest.mark.parametrize(
    "name", ["req_id_to_index", "num_computed_prefill_tokens", "prefill_len"]
)
def test_unreadable_request_state_gives_vllm_count_and_fails_the_patch(
    name: str,
    applied_patch: Any,
    target_dispatch: DispatchRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    width = 4
    step = make_step(fresh_prompts(width), width)
    runner = step.runner
    update = type(runner).update_requests

    def update_then_rename(scheduler_output: Any) -> None:
        update(runner, scheduler_output)
        runner.req_states.hidden = frozenset({name})

    runner.update_requests = update_then_rename

    with caplog.at_level("WARNING", logger="vllm.graphsafe"):
        run_execute_model(step)

    assert target_dispatch.counts == [width], "not vLLM's own shape count"
    assert applied_patch.state is PatchState.FAILED
    assert name in applied_patch.reason
    ours = [r.getMessage() for r in caplog.records if r.name == "vllm.graphsafe"]
    assert len(ours) == 1 and PATCH_ID in ours[0]
    module = importlib.import_module(RUNNER_MODULE)
    assert not is_hooked(module.get_uniform_token_count)
    assert not is_hooked(vars(module.GPUModelRunner)["execute_model"])


@pytest.mark.parametrize("speculator", SPECULATORS[:1], ids=SPECULATOR_IDS[:1])
def test_unreadable_draft_batch_state_gives_vllm_count_and_fails_the_patch(
    speculator: tuple[str, str],
    applied_patch: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    width = 4
    step = draft_step(fresh_prompts(width), width)
    if mrv2_state.batch_has_phase_column():
        name = "is_prefilling_np"
        batch = input_batch(step, **{name: None})
    else:
        # 0.20: a batch whose rows vLLM was never asked about before its step.
        name = "idx_mapping_np"
        batch = input_batch(step)
        batch.idx_mapping_np = batch.idx_mapping_np.copy()
    drafter, dispatch = make_speculator(*speculator, width - 1, monkeypatch)

    propose(drafter, batch)

    assert dispatch.counts == [width], "not vLLM's own shape count"
    assert applied_patch.state is PatchState.FAILED
    assert name in applied_patch.reason


@pytest.mark.parametrize(
    ("module", "renamed"),
    [
        (vllm_layout.MRV2_STATES, "req_id_to_index"),
        (vllm_layout.MRV2_STATES, "prefill_len"),
        (vllm_layout.MRV2_INPUT_BATCH, "is_prefilling_np"),
    ],
)
def test_a_state_column_renamed_in_source_fails_at_bind_naming_it(
    module: str, renamed: str
) -> None:
    texts = {
        RUNNER_MODULE: _RUNNER_SOURCE,
        AR: _speculator_source("AutoRegressiveSpeculator"),
        module: _STATE_SOURCES[module].replace(renamed, f"{renamed}_v2"),
    }

    patch = decided(texts)

    assert patch.state is PatchState.FAILED
    assert renamed in patch.reason


@pytest.mark.parametrize(
    "mention",
    [
        "# see gather_batch_req_state() upstream\n        ",
        'logger.debug("no get_uniform_decode_token_count() here")\n        ',
        "self.gather_batch_req_state = None\n        ",
    ],
    ids=["comment", "log-string", "unrelated-use"],
)
def test_a_runner_that_only_mentions_the_fix_is_still_patched(mention: str) -> None:
    source = _RUNNER_SOURCE.replace(
        "count = get_uniform_token_count", mention + "count = get_uniform_token_count"
    )

    patch = decided({RUNNER_MODULE: source})

    assert patch.state is PatchState.APPLIED, patch.reason


@pytest.mark.parametrize(
    "call",
    [
        "get_uniform_decode_token_count(1, 1, 1, True)",
        "self._get_uniform_decode_token_count(scheduler_output, dummy_run)",
    ],
)
def test_each_upstream_classification_call_is_read_but_not_native(call: str) -> None:
    """Calls of upstream's helpers that are not there to run: reading finds
    them, and a name alone is never native."""
    source = _RUNNER_SOURCE.replace("get_uniform_token_count(1, 1, 1)", call)

    patch = decided({RUNNER_MODULE: source})

    assert patch.state is not PatchState.NATIVE
    evidence = patch.evidence
    assert evidence is not None and evidence.how == "reading"
    assert evidence.reading is not None and "unconfirmed" in evidence.reading
    assert call.split("(")[0].removeprefix("self.") in evidence.reading
