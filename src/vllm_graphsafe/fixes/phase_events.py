"""The decisions both phase-aware dispatch fixes count (V1 and Model Runner V2),
so ``/metrics`` and the statistics files read the same for either runner."""

from __future__ import annotations

#: Steps that replay a uniform-decode graph under the phase rule.
UNIFORM_DECODE = "uniform_decode"
#: Steps whose shape alone would have picked the decode graph, kept off by phase.
KEPT_OFF_DECODE = "prefill_kept_off_decode_graph"
#: Dummy, capture and profile runs, classified by shape as vLLM asks.
DUMMY = "dummy"
#: Real steps with a non-uniform shape, which skip the request-state scan.
NON_UNIFORM = "non_uniform"

PHASE_RULE_EVENTS = (UNIFORM_DECODE, KEPT_OFF_DECODE, DUMMY, NON_UNIFORM)
