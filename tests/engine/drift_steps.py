"""Run a real in-process vLLM engine whose input batch drifted under the plugin.

Usage: python drift_steps.py MODEL_DIR (drift|plain)  (one JSON object, last line)

``drift`` makes ``InputBatch.num_prompt_tokens`` unreadable to this project's
code only, as a release that renamed it would be to the plugin while vLLM's
own code (which reads its own name) keeps working. The engine must keep
generating what unpatched vLLM generates.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout

SPEC_TOKENS = 3
RENAMED = "num_prompt_tokens"


def read_by_graphsafe() -> bool:
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")).startswith("vllm_graphsafe")


def hide_prompt_lengths_from_the_plugin() -> None:
    batches = vllm_layout.load(vllm_layout.V1_INPUT_BATCH)

    def getter(batch: Any) -> Any:
        if read_by_graphsafe():
            raise AttributeError(f"'InputBatch' object has no attribute '{RENAMED}'")
        return batch.__dict__["_drifted_prompt_lengths"]

    def setter(batch: Any, value: Any) -> None:
        batch.__dict__["_drifted_prompt_lengths"] = value

    drifted = type(
        "InputBatch", (batches.InputBatch,), {RENAMED: property(getter, setter)}
    )

    def drift_after_init(wrapped: Any, batch: Any, args: Any, kwargs: Any) -> Any:
        result = wrapped(*args, **kwargs)
        if type(batch) is batches.InputBatch:
            lengths = batch.__dict__.pop(RENAMED)
            batch.__class__ = drifted
            setattr(batch, RENAMED, lengths)
        return result

    wrapt.wrap_function_wrapper(batches.InputBatch, "__init__", drift_after_init)


def main(model_dir: str, mode: str) -> None:
    from vllm import LLM, SamplingParams

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    if mode == "drift":
        hide_prompt_lengths_from_the_plugin()
    llm = LLM(model=model_dir, **engine_kwargs(num_speculative_tokens=SPEC_TOKENS))
    tokenizer = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    boundary = tokenizer.encode("one two three four five six", add_special_tokens=False)
    prompts: list[Any] = [TokensPrompt(prompt_token_ids=boundary[: SPEC_TOKENS + 1])]
    prompts += [
        "the numbers go 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
        "write the word and the word and the word and the word",
    ]
    outputs = []
    for prompt in prompts:
        outputs += llm.generate([prompt], greedy, use_tqdm=False)

    from vllm_graphsafe.plugin import registry

    patch = registry().get("v1-phase-dispatch")
    print(
        json.dumps(
            {
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                "state": patch.state.value if patch.state else None,
                "reason": patch.reason,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
