"""The names of the dispatch decisions the fixes count."""

from __future__ import annotations

#: Steps that replay a uniform-decode graph under the phase rule.
UNIFORM_DECODE = "uniform_decode"
#: Steps whose shape alone would have picked the decode graph, kept off by phase.
KEPT_OFF_DECODE = "prefill_kept_off_decode_graph"
#: Dummy, capture and profile runs, classified by shape as vLLM asks.
DUMMY = "dummy"
#: Real steps with a non-uniform shape, which skip the request-state scan.
NON_UNIFORM = "non_uniform"
#: Dummy runs whose metadata the staging patch made consistent.
STAGED_DUMMY = "staged_dummy"
