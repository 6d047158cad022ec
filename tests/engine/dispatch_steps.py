"""Run a real in-process vLLM engine and print how each real step was dispatched.

Usage: python dispatch_steps.py MODEL_DIR  (prints one JSON object on its last line)

The ground truth comes from the scheduler, not from the runner: a step holds
prompt tokens when a scheduled request had computed less than its prompt.
What the runner decided is what reached vLLM's CUDA graph dispatcher.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import wrapt

SPEC_TOKENS = 3


def main(model_dir: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    steps: list[dict[str, Any]] = []
    current: dict[str, Any] = {}

    def record_step(wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        scheduler_output = args[0] if args else kwargs["scheduler_output"]
        scheduled = scheduler_output.num_scheduled_tokens
        if not scheduled:
            return wrapped(*args, **kwargs)
        prompt_tokens = False
        for new in scheduler_output.scheduled_new_reqs:
            prompt_tokens |= new.num_computed_tokens < len(new.prompt_token_ids)
        cached = scheduler_output.scheduled_cached_reqs
        computed_counts = cached.num_computed_tokens
        for req_id, computed in zip(cached.req_ids, computed_counts, strict=True):
            prompt_tokens |= computed < runner.requests[req_id].num_prompt_tokens
        widths = list(scheduled.values())
        current.clear()
        current.update(
            holds_prompt_tokens=bool(prompt_tokens),
            decode_shape=set(widths) == {SPEC_TOKENS + 1},
            widths=widths,
            uniform_decode=None,
        )
        try:
            return wrapped(*args, **kwargs)
        finally:
            steps.append(dict(current))
            current.clear()

    def record_dispatch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if current and current["uniform_decode"] is None:
            current["uniform_decode"] = bool(kwargs.get("uniform_decode", False))
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(
        "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model", record_step
    )
    wrapt.wrap_function_wrapper(
        "vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher.dispatch", record_dispatch
    )

    llm = LLM(model=model_dir, **engine_kwargs(num_speculative_tokens=SPEC_TOKENS))
    tokenizer = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    boundary = tokenizer.encode("one two three four five six", add_special_tokens=False)
    longer = [
        "the numbers go 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
        "write the word and the word and the word and the word",
    ]
    outputs = []
    for prompt in [TokensPrompt(prompt_token_ids=boundary[: SPEC_TOKENS + 1])]:
        outputs += llm.generate([prompt], greedy, use_tqdm=False)
    outputs += llm.generate(longer, greedy, use_tqdm=False)
    print(
        json.dumps(
            {
                "steps": steps,
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
