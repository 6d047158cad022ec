"""The fixes of this package: one folder each, one list that everything reads.

The registry, doctor, the catalogue and README tables, the release table, the
sweep, ``scripts/run_suite.py``, the backport and its verification, the
benchmarks and the metrics all iterate :func:`all_fixes`; none names a fix.
Importing this module imports only every fix's facts; a fix's judge, hooks
and backport planner are imported by what needs them. Adding a fix:
``docs/adding-a-fix.md``.
"""

from __future__ import annotations

from vllm_graphsafe.fix import Fix as Fix
from vllm_graphsafe.fixes import (
    mrv2_phase_dispatch,
    replay_guard,
    v1_dummy_staging,
    v1_phase_dispatch,
)

#: Every fix, in the order it is applied and backported (the two V1 fixes edit
#: the same runner file, in this order; the replay guard edits MRV2's runner
#: after its dispatch fix).
ALL_FIXES: tuple[Fix, ...] = (
    v1_phase_dispatch.FIX,
    v1_dummy_staging.FIX,
    mrv2_phase_dispatch.FIX,
    replay_guard.FIX,
)


def all_fixes() -> tuple[Fix, ...]:
    """The fixes, read at call time (a test may register one more)."""
    return ALL_FIXES


def fix_ids() -> list[str]:
    return [fix.id for fix in all_fixes()]


def get(fix_id: str) -> Fix:
    for fix in all_fixes():
        if fix.id == fix_id:
            return fix
    raise KeyError(fix_id)


def decision_events() -> list[str]:
    """Every decision event a fix counts, each once, in the fixes' order."""
    return list(dict.fromkeys(event for fix in all_fixes() for event in fix.events))
