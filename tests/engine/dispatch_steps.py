"""Run a real in-process vLLM engine and print how each real step was dispatched.

Usage: python dispatch_steps.py MODEL_DIR  (prints one JSON object on its last line)

The ground truth comes from the scheduler, not from the runner: a step holds
prefill rows when the attention metadata builders of a hybrid model run a
scheduled row as a prefill (a prompt chunk, or tokens re-computed after
preemption).
What the runner decided is what reached vLLM's CUDA graph dispatcher first in
the step (:class:`tests.engine.emulator.step_recording.StepRecorder`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vllm_graphsafe import vllm_layout

SPEC_TOKENS = 3


def main(model_dir: str) -> None:
    from vllm import LLM, SamplingParams

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.engine.emulator.step_recording import StepRecorder

    recorder = StepRecorder(dispatch_call="first").install()

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
                "steps": [
                    {
                        "holds_prefill_rows": bool(step["prefill_rows"]),
                        "decode_shape": set(step["widths"]) == {SPEC_TOKENS + 1},
                        "widths": step["widths"],
                        "uniform_decode": step["uniform_decode"],
                    }
                    for step in recorder.steps
                ],
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
