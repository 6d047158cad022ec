"""Run a real in-process vLLM engine whose input batch drifted under the plugin.

Usage: python drift_steps.py MODEL_DIR (drift|plain)  (one JSON object, last line)

``drift`` makes the runner's ``num_decode_draft_tokens`` and the input
batch's ``num_prompt_tokens`` (what the V1 phase rule reads for each row)
unreadable to this project's code only, as a release that renamed them would
be to the plugin while vLLM's own code (which reads its own names) keeps
working. The engine must keep generating what
unpatched vLLM generates.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import wrapt

from vllm_graphsafe import vllm_layout

SPEC_TOKENS = 3
#: What the V1 phase rule reads for each row, renamed away from the plugin: the
#: builders' draft counts and, where a runner has none, the prompt lengths.
RENAMED = (
    (vllm_layout.V1_RUNNER, "GPUModelRunner", "num_decode_draft_tokens"),
    (vllm_layout.V1_INPUT_BATCH, "InputBatch", "num_prompt_tokens"),
)


def read_by_graphsafe() -> bool:
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")).startswith("vllm_graphsafe")


def hide_from_the_plugin(owner: type, name: str) -> None:
    """``name`` on each ``owner`` built from now on reads as missing to this
    project's code, and as before to vLLM's."""
    stored = f"_drifted_{name}"

    def getter(instance: Any) -> Any:
        if read_by_graphsafe():
            raise AttributeError(f"'{type(instance).__name__}' has no '{name}'")
        return instance.__dict__[stored]

    def setter(instance: Any, value: Any) -> None:
        instance.__dict__[stored] = value

    def drift_after_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        result = wrapped(*args, **kwargs)
        if name in instance.__dict__:
            value = instance.__dict__.pop(name)
            instance.__class__ = type(
                type(instance).__name__,
                (type(instance),),
                {name: property(getter, setter)},
            )
            setattr(instance, name, value)
        return result

    wrapt.wrap_function_wrapper(owner, "__init__", drift_after_init)


def hide_phase_columns_from_the_plugin() -> None:
    for module, owner, name in RENAMED:
        hide_from_the_plugin(getattr(vllm_layout.load(module), owner), name)


def main(model_dir: str, mode: str) -> None:
    from vllm import LLM, SamplingParams

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    if mode == "drift":
        hide_phase_columns_from_the_plugin()
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
