"""One module per patched vLLM target; ``all_patches`` lists them in apply order."""

from __future__ import annotations

from vllm_graphsafe.registry import Patch


def all_patches() -> list[Patch]:
    from vllm_graphsafe.patches.mrv2_phase_dispatch import MRV2PhaseDispatchPatch
    from vllm_graphsafe.patches.v1_dummy_staging import V1DummyStagingPatch
    from vllm_graphsafe.patches.v1_phase_dispatch import V1PhaseDispatchPatch

    return [V1PhaseDispatchPatch(), V1DummyStagingPatch(), MRV2PhaseDispatchPatch()]
