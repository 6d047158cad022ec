"""What the test suite knows of each fix beyond its facts: which releases were
surveyed to have it, the dispatch the benchmarks measure, the negative controls
that remove one piece of it, and the tests that pin the plugin's own form.

``scripts/run_suite.py``, ``scripts/verify_backport.py``, ``tests/conftest.py``
and the benchmarks read it; the package does not ship it. Standard library
only: the scripts read it under the machine's own ``python3``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from vllm_graphsafe.fixes import all_fixes
from vllm_graphsafe.releases import release_key


class ExtraControl(NamedTuple):
    """A negative control beyond the plugin switched off: one piece of the fix
    removed (``attribute`` of ``module`` replaced by ``replacement``) under a
    pytest option, and the tests that must catch it."""

    #: The pytest option that removes the piece, e.g. ``--drop-seq-len-floor``.
    option: str
    #: The option's help, and the label run_suite.py prints.
    removes: str
    module: str
    attribute: str
    replacement: Callable[..., Any]
    #: pytest arguments selecting the tests that must catch it.
    tests: tuple[str, ...]
    #: What the tests catch, for "no test caught ...".
    caught: str


class FixTests(NamedTuple):
    #: The first minor release (``(0, 28)``) whose code has the fix natively,
    #: as surveyed; None: every surveyed release lacks it.
    native_from: tuple[int, int] | None = None
    #: The first minor release without the code the fix is about (0.34 removed
    #: the V1 runner); None: every surveyed release has it.
    absent_from: tuple[int, int] | None = None
    #: The runner whose CUDA-graph dispatch it decides (``"v1"`` or ``"mrv2"``),
    #: for the dispatch benchmarks; None: it decides no dispatch.
    dispatch_runner: str | None = None
    extra_controls: tuple[ExtraControl, ...] = ()
    #: Regression tests that pin the plugin's runtime form rather than the fix:
    #: the backport's verification does not run them on the edited tree.
    plugin_form_only: tuple[str, ...] = ()


def prompt_length_rule(runner: Any, num_reqs: int, decode_query_len: int) -> bool:
    """The earlier V1 rule, every row had computed its whole prompt (a control)."""
    batch = runner.input_batch
    past_prompt = (
        batch.num_computed_tokens_cpu[:num_reqs] >= batch.num_prompt_tokens[:num_reqs]
    )
    return bool(past_prompt.all())


def requested_length(requested: Any, num_scheduled: Any) -> Any:
    """The dummy staging's sequence length without its lower bound (a control)."""
    return requested


#: By fix id; a fix without an entry has none of these.
FIX_TESTS: dict[str, FixTests] = {
    "v1-phase-dispatch": FixTests(
        absent_from=(0, 34),
        dispatch_runner="v1",
        extra_controls=(
            ExtraControl(
                option="--prompt-length-rule",
                removes="row rule replaced by the prompt-length predicate",
                module="vllm_graphsafe.fixes.v1_phase_dispatch.hooks",
                attribute="rows_are_decodes",
                replacement=prompt_length_rule,
                tests=(
                    "tests/release/classes/test_v1_phase_dispatch.py",
                    "-k",
                    "builders_classify",
                ),
                caught="a re-prefill or padded row classified by prompt length",
            ),
        ),
        # The plugin makes ``_is_uniform_decode`` phase-aware *on a runner
        # instance*, while the source fix keeps vLLM's static shape rule
        # (upstream's tests call it on the class) and checks the phase in the
        # dispatch.
        plugin_form_only=(
            "tests/release/classes/test_v1_phase_dispatch.py::"
            "test_the_rule_on_a_runner_takes_keywords_or_positions",
        ),
    ),
    "v1-dummy-staging": FixTests(
        absent_from=(0, 34),
        extra_controls=(
            ExtraControl(
                option="--drop-seq-len-floor",
                removes="sequence-length lower bound removed",
                module="vllm_graphsafe.fixes.v1_dummy_staging.logic",
                attribute="seq_len_floor",
                replacement=requested_length,
                tests=(
                    "tests/release/classes/test_v1_dummy_staging.py",
                    "-k",
                    "short_override or profile_length_with_four",
                ),
                caught="the negative length",
            ),
        ),
    ),
    "mrv2-phase-dispatch": FixTests(native_from=(0, 28), dispatch_runner="mrv2"),
    # The plugin counts and warns in its own words; the source edit logs
    # vLLM's warning once and counts nothing.
    "replay-guard": FixTests(
        plugin_form_only=(
            "tests/release/classes/test_replay_guard.py::"
            "test_the_fallback_is_counted_and_a_replay_too",
            "tests/release/classes/test_replay_guard.py::"
            "test_one_warning_per_process_with_the_steps_shape",
            "tests/release/classes/test_replay_guard_mrv2.py::"
            "test_target_fallbacks_and_replays_are_counted",
            "tests/release/classes/test_replay_guard_mrv2.py::"
            "test_draft_fallbacks_are_counted_apart",
        )
    ),
}


def tests_of(fix_id: str) -> FixTests:
    return FIX_TESTS.get(fix_id, FixTests())


def extra_controls(fix_ids: list[str] | None = None) -> list[ExtraControl]:
    """The extra negative controls of these fixes (all where None)."""
    ids = [fix.id for fix in all_fixes()] if fix_ids is None else fix_ids
    return [control for fix_id in ids for control in tests_of(fix_id).extra_controls]


def plugin_form_only() -> list[str]:
    return [test for fix in all_fixes() for test in tests_of(fix.id).plugin_form_only]


def dispatch_fixes() -> dict[str, str]:
    """Runner (``"v1"``, ``"mrv2"``) -> the id of the fix that decides its
    CUDA-graph dispatch, for the dispatch benchmarks."""
    return {
        runner: fix.id
        for fix in all_fixes()
        if (runner := tests_of(fix.id).dispatch_runner) is not None
    }


#: The minor releases whose code was surveyed for each fix (``native_from``).
SURVEYED = ((0, 20), (0, 34))


def surveyed_states(version: str) -> dict[str, str] | None:
    """The state each fix reaches on ``version`` by the survey, or None outside
    it: ``native`` from the release a fix's code landed in, else ``applied``;
    a fix whose code the release no longer has: ``not applicable``."""
    minor = release_key(version)[:2]
    if not SURVEYED[0] <= minor <= SURVEYED[1]:
        return None
    found = {}
    for fix in all_fixes():
        facts = tests_of(fix.id)
        if facts.absent_from is not None and minor >= facts.absent_from:
            found[fix.id] = "not applicable"
        elif facts.native_from is not None and minor >= facts.native_from:
            found[fix.id] = "native"
        else:
            found[fix.id] = "applied"
    return found
