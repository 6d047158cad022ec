"""Where the MRV2 phase rule's per-step cost goes, and what its shortcuts save.

The benchmark's worst case: N scheduled decodes and 64 more live requests
mid-prefill that the step does not schedule. Some row of the request-state table
is then in prefill, so the rule must find each scheduled request's row by its
id (``req_id_to_index``, the request state upstream's fix reads) and look there.
This times the plugin's own :class:`PrefillColumns` on that shape, whole and in
its parts, with the id lookups as a Python loop would do them and the index
array as ``np.array`` would build it; then the typical
case (no row in prefill), whole and as it would be without comparing the two
columns' bytes first (best of 7 repeats of 2,000 calls each; µs per call):

    python bench/mrv2_worst_case_profile.py
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from operator import itemgetter

import numpy as np

from vllm_graphsafe.fixes.phase_rows import PrefillColumns

MID_PREFILL = 64
#: Calls per repeat (best of 7 repeats).
CALLS = 2000


def best_us(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=CALLS, repeat=7)) / CALLS * 1e6


def profile(scheduled_count: int) -> dict[str, float]:
    ids = [f"req-{i}" for i in range(scheduled_count + MID_PREFILL)]
    row_of = {req_id: row for row, req_id in enumerate(ids)}
    scheduled = {req_id: 1 for req_id in ids[:scheduled_count]}
    computed = np.full(len(ids), 100, np.int32)
    prefill_len = np.full(len(ids), 100, np.int32)
    computed[scheduled_count:], prefill_len[scheduled_count:] = 5, 50
    columns = PrefillColumns(computed, prefill_len)
    assert columns.scheduled_in_prefill(row_of, scheduled) is False
    found = itemgetter(*scheduled)(row_of)
    rows = np.fromiter(found, np.intp, scheduled_count)
    in_prefill = computed < prefill_len
    # The typical case: every row of the table past its prompt.
    decoding = PrefillColumns(prefill_len.copy(), prefill_len)
    assert decoding.scheduled_in_prefill(row_of, scheduled) is False
    return {
        "worst case, whole call": best_us(
            lambda: columns.scheduled_in_prefill(row_of, scheduled)
        ),
        "  id -> row lookups": best_us(lambda: itemgetter(*scheduled)(row_of)),
        "  the same as a Python loop": best_us(
            lambda: [row_of[req_id] for req_id in scheduled]
        ),
        "  rows -> index array": best_us(
            lambda: np.fromiter(found, np.intp, scheduled_count)
        ),
        "  the same by np.array": best_us(lambda: np.array(found, dtype=np.intp)),
        "  column comparison": best_us(
            lambda: (
                computed.tobytes() == prefill_len.tobytes(),
                np.count_nonzero(computed < prefill_len),
            )
        ),
        "  gather of the rows": best_us(lambda: np.count_nonzero(in_prefill[rows])),
        "typical case, whole call": best_us(
            lambda: decoding.scheduled_in_prefill(row_of, scheduled)
        ),
        "  the same without the bytes test": best_us(
            lambda: np.count_nonzero(prefill_len < prefill_len)
        ),
    }


def main() -> int:
    for count in (256, 1024):
        parts = profile(count)
        print(f"{count} scheduled, {MID_PREFILL} unscheduled mid-prefill:")
        for name, micros in parts.items():
            print(f"  {name:<36} {micros:7.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
