"""State builders for vLLM's runner classes, for the tests, benchmarks and sweep.

The release's real runner code runs here on CPU without an engine: a runner (V1
``GPUModelRunner`` or Model Runner V2's) or a speculator is made with
``object.__new__`` and given only the attributes its code reads up to the
CUDA-graph dispatch, which a recorder replaces. The class-level tests
(``tests/release``), the dispatch benchmarks (``bench/``) and the release sweep
build their runners with these modules, so all of them exercise the same state:

- :mod:`.v1_runner`: a V1 runner and its input batch, up to the dispatch.
- :mod:`.v1_dummy`: a V1 runner for ``_dummy_run``, recording the metadata it stages.
- :mod:`.mrv2_state`: Model Runner V2 request states, steps and input batches.
- :mod:`.mrv2_speculators`: MRV2 speculators, up to their dispatch.
- :mod:`.mrv2_replay`: MRV2 steps and speculators run to their FULL-graph
  replays and on to their end.
- :mod:`.hybrid_metadata`: a step's attention metadata from the release's own
  hybrid-model state and GDN or Mamba2 builder.

Importing them imports neither vLLM nor torch; the functions that build state
import the installed release (and torch) when called.
"""
