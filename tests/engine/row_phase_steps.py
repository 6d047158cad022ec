"""Run a real in-process vLLM engine on the two rows a prompt-length rule misreads.

Usage: python row_phase_steps.py MODEL_DIR [--prompt-length-rule]
(prints one JSON object on its last line)

Speculation K=3, prefill chunks of at most 4 tokens
(``long_prefill_token_threshold``), a 10-block KV cache and prefix caching:

- preemption: eight long generations overflow the cache; a resumed request
  re-computes its earlier output tokens, past its prompt and without drafts,
  in chunks of exactly K+1;
- padded prompt tail: a prompt of one block plus one token, sent again, hits
  the prefix cache for all but its last token, and the scheduler pads that
  token with K placeholder drafts.

Each real step's rows come from the scheduler's output (computed counts,
drafts; prompt lengths from the runner's request table after the step); what
the runner decided is the first ``uniform_decode`` handed to the CUDA graph
dispatcher in the step. ``--prompt-length-rule`` swaps the fix's row rule for
the earlier prompt-length predicate (the fix's extra control).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout

SPEC_TOKENS = 3
NUM_BLOCKS = 10
#: Tokens of each preemption request's generation.
LONG_GENERATION = 200


def scheduled_rows(scheduler_output: Any) -> dict[str, dict[str, Any]]:
    """Per scheduled request: width, computed before the step, drafts (or None)."""
    drafts = scheduler_output.scheduled_spec_decode_tokens
    rows = {
        new.req_id: {"computed": new.num_computed_tokens}
        for new in scheduler_output.scheduled_new_reqs
    }
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(
        cached.req_ids, cached.num_computed_tokens, strict=True
    ):
        rows[req_id] = {"computed": computed}
    for req_id, row in rows.items():
        row["width"] = scheduler_output.num_scheduled_tokens[req_id]
        row["drafts"] = len(drafts[req_id]) if req_id in drafts else None
    return rows


class Recorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None

    def install(self) -> None:
        wrapt.wrap_function_wrapper(
            vllm_layout.V1_RUNNER, "GPUModelRunner.execute_model", self._step
        )
        wrapt.wrap_function_wrapper(
            vllm_layout.CUDAGRAPH_DISPATCHER,
            "CudagraphDispatcher.dispatch",
            self._dispatch,
        )

    def _step(self, wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        scheduler_output = args[0] if args else kwargs["scheduler_output"]
        if not scheduler_output.total_num_scheduled_tokens or self._current:
            return wrapped(*args, **kwargs)
        step: dict[str, Any] = {
            "rows": scheduled_rows(scheduler_output),
            "uniform_decode": None,
        }
        self._current = step
        try:
            return wrapped(*args, **kwargs)
        finally:
            self._current = None
            for req_id, row in step["rows"].items():
                state = runner.requests.get(req_id)
                row["prompt"] = None if state is None else state.num_prompt_tokens
            step["rows"] = list(step["rows"].values())
            self.steps.append(step)

    def _dispatch(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        step = self._current
        if step is not None and step["uniform_decode"] is None:
            step["uniform_decode"] = bool(kwargs.get("uniform_decode", False))
        return wrapped(*args, **kwargs)


def use_prompt_length_rule() -> None:
    from tests.support.fix_tests import tests_of
    from vllm_graphsafe.fixes.v1_phase_dispatch import hooks

    (control,) = tests_of("v1-phase-dispatch").extra_controls
    setattr(hooks, control.attribute, control.replacement)


def main(model_dir: str, prompt_length_rule: bool) -> None:
    from vllm import LLM, SamplingParams

    from vllm_graphsafe.local_engine.cpu_config import BLOCK_SIZE, engine_kwargs

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt
    if prompt_length_rule:
        use_prompt_length_rule()
    recorder = Recorder()
    recorder.install()

    kwargs = {
        **engine_kwargs(num_speculative_tokens=SPEC_TOKENS),
        "max_model_len": NUM_BLOCKS * BLOCK_SIZE - BLOCK_SIZE,
        "num_gpu_blocks_override": NUM_BLOCKS,
        "long_prefill_token_threshold": SPEC_TOKENS + 1,
        "enable_prefix_caching": True,
    }
    llm = LLM(model=model_dir, **kwargs)
    vocab = llm.get_tokenizer().vocab_size

    def tokens(seed: int, n: int) -> Any:
        return TokensPrompt(
            prompt_token_ids=[
                (seed * 7919 + 31 * i) % (vocab - 10) + 5 for i in range(n)
            ]
        )

    tail = tokens(1, BLOCK_SIZE + 1)
    short = SamplingParams(temperature=0.0, max_tokens=8)
    outputs = llm.generate([tail], short, use_tqdm=False)
    padded_from = len(recorder.steps)
    outputs += llm.generate([tail], short, use_tqdm=False)
    padded_to = len(recorder.steps)
    long = SamplingParams(temperature=0.0, max_tokens=LONG_GENERATION, ignore_eos=True)
    outputs += llm.generate(
        [tokens(10 + i, 40 + 9 * i) for i in range(8)], long, use_tqdm=False
    )
    print(
        json.dumps(
            {
                "steps": recorder.steps,
                "padded_admission_steps": [padded_from, padded_to],
                "spec_tokens": SPEC_TOKENS,
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], "--prompt-length-rule" in sys.argv[2:])
