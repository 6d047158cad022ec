"""Where the V1 phase rule's per-step cost goes, inside one vLLM release.

The benchmark holds the V1 rule's added cost against vLLM's shape rule at 256
and 1024 requests (goal: at most half of it). This times, on the release's own
runner class over the class tests' fakes (as ``dispatch_cost.py`` builds them,
counting into counts pages as a served process does), the dispatch's
classification with either rule, then the phase rule's parts: vLLM's shape rule
called alone, the count of the decision, and the read of the rows' draft counts
(best of 7 repeats of 20,000 calls each; µs per call). Run it with a release's
python:

    .venvs/cpu-0.32.0/bin/python bench/v1_rule_profile.py
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable
from pathlib import Path

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
    }


def main() -> int:
    import_vllm("process")
    runners = v1_runners()
    print(f"vLLM {vllm_version()}, V1 runner, K = {DECODE_QUERY_LEN - 1}:")
    with counting_as_a_server_does():
        for num_reqs in SIZES:
            print(f"{num_reqs} scheduled decodes:")
            for name, micros in profile(runners, num_reqs).items():
                print(f"  {name:<28} {micros:7.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
