"""Where the V1 phase rule's per-step cost goes, inside one vLLM release.

The benchmark holds the V1 rule's added cost against vLLM's shape rule at 256
and 1024 requests (goal: at most as much again). This times, on the release's
own runner class over the class tests' fakes (as ``dispatch_cost.py`` builds
them, counting into counts pages as a served process does), the dispatch's
classification with either rule, then the phase rule's parts: vLLM's shape rule
called alone, the count of the decision, and the read of the rows' draft counts;
then what the read would cost without the view and bytes it keeps. Without
speculation (K = 0) the rule reads the rows' computed counts instead: its own
cost there (the bound rule less vLLM's, same arguments) and that read, with
and without the view it keeps. Best of 7 repeats of 20,000 calls each; µs per call.
Run it with a release's python:

    .venvs/cpu-0.32.0/bin/python bench/v1_rule_profile.py
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make bench importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dispatch_cost import (
    DECODE_QUERY_LEN,
    V1Runners,
    _v1_step,
    counting_as_a_server_does,
    v1_runners,
    vllm_version,
)
from bench.plugin_cost import import_vllm

SIZES = (256, 1024)
#: Calls per repeat (best of 7 repeats).
CALLS = 20_000


def best_us(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=CALLS, repeat=7)) / CALLS * 1e6


def profile(runners: V1Runners, num_reqs: int) -> dict[str, float]:
    import numpy as np

    from vllm_graphsafe import counts
    from vllm_graphsafe.fixes.phase_events import UNIFORM_DECODE
    from vllm_graphsafe.fixes.phase_rows import _uniform_check, rows_have_prior_state
    from vllm_graphsafe.fixes.v1_phase_dispatch.hooks import (
        PATCH_ID,
        rows_are_decodes,
    )

    shape_runner, phase_runner = runners.shape, runners.phase
    scheduled = np.full(num_reqs, DECODE_QUERY_LEN, dtype=np.int32)
    shape_step = _v1_step(shape_runner, scheduled)
    phase_step = _v1_step(phase_runner, scheduled)
    assert shape_step() is True and phase_step() is True
    arguments = (DECODE_QUERY_LEN, DECODE_QUERY_LEN, num_reqs * DECODE_QUERY_LEN)
    shape_rule = type(shape_runner)._is_uniform_decode
    count = counts.STATS.counter(PATCH_ID)
    shape_us = best_us(shape_step)
    phase_us = best_us(phase_step)
    drafts = phase_runner.num_decode_draft_tokens.np

    def read_made_afresh() -> bool:
        _, _, _, view, expected = _uniform_check(drafts, num_reqs, DECODE_QUERY_LEN - 1)
        return bool(view.tobytes() == expected)

    assert read_made_afresh()
    # Without speculation: one token per row, each over prior state.
    one_token = (1, 1, num_reqs)
    phase_rule = phase_runner._is_uniform_decode
    assert phase_rule(*one_token, num_reqs, None) is True
    computed = phase_runner.input_batch.num_computed_tokens_cpu
    k0_own = best_us(lambda: phase_rule(*one_token, num_reqs, None)) - best_us(
        lambda: shape_rule(*one_token, num_reqs, None)
    )
    return {
        "shape rule step": shape_us,
        "phase rule step": phase_us,
        "added by the phase rule": phase_us - shape_us,
        "  vLLM's shape rule alone": best_us(
            lambda: shape_rule(*arguments, num_reqs, None)
        ),
        "  count of the decision": best_us(lambda: count(UNIFORM_DECODE)),
        "  read of the rows' counts": best_us(
            lambda: rows_are_decodes(phase_runner, num_reqs, DECODE_QUERY_LEN)
        ),
        "  the same, view and bytes made each step": best_us(read_made_afresh),
        "K = 0: the rule's own cost": k0_own,
        "  read of the rows' computed counts": best_us(
            lambda: rows_have_prior_state(computed, num_reqs)
        ),
        "  the same, its view sliced each step": best_us(
            lambda: rows_sliced_each_step(computed, num_reqs)
        ),
    }


def rows_sliced_each_step(computed: Any, num_rows: int) -> bool:
    """``rows_have_prior_state`` without the view it keeps."""
    import numpy as np

    rows = computed[:num_rows]
    if len(rows) != num_rows:
        return False
    return bool(np.count_nonzero(rows) == num_rows)


def main() -> int:
    import_vllm("process")
    runners = v1_runners()
    print(f"vLLM {vllm_version()}, V1 runner, K = {DECODE_QUERY_LEN - 1}:")
    with counting_as_a_server_does():
        for num_reqs in SIZES:
            print(f"{num_reqs} scheduled decodes:")
            for name, micros in profile(runners, num_reqs).items():
                print(f"  {name:<42} {micros:7.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
