"""Run a real in-process vLLM engine whose input batch drifted under the plugin.

Usage: python drift_steps.py MODEL_DIR (drift|plain)  (one JSON object, last line)

``drift`` makes the runner's ``num_decode_draft_tokens`` (the rows' draft
counts the V1 phase rule reads) unreadable to this project's code only, as a
release that renamed it would be to the plugin while vLLM's own code (which
reads its own name) keeps working. The engine must keep generating what
unpatched vLLM generates.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout

SPEC_TOKENS = 3
RENAMED = "num_decode_draft_tokens"


def read_by_graphsafe() -> bool:
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")).startswith("vllm_graphsafe")


def hide_draft_counts_from_the_plugin() -> None:
    runners = vllm_layout.load(vllm_layout.V1_RUNNER)

    def getter(runner: Any) -> Any:
        if read_by_graphsafe():
            raise AttributeError(f"'{type(runner).__name__}' has no '{RENAMED}'")
        return runner.__dict__["_drifted_draft_counts"]

    def setter(runner: Any, value: Any) -> None:
        runner.__dict__["_drifted_draft_counts"] = value

    def drift_after_init(wrapped: Any, runner: Any, args: Any, kwargs: Any) -> Any:
        result = wrapped(*args, **kwargs)
        if RENAMED in runner.__dict__:
            counts = runner.__dict__.pop(RENAMED)
            runner.__class__ = type(
                type(runner).__name__,
                (type(runner),),
                {RENAMED: property(getter, setter)},
            )
            setattr(runner, RENAMED, counts)
        return result

    wrapt.wrap_function_wrapper(runners.GPUModelRunner, "__init__", drift_after_init)


def main(model_dir: str, mode: str) -> None:
    from vllm import LLM, SamplingParams

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    if mode == "drift":
        hide_draft_counts_from_the_plugin()
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
