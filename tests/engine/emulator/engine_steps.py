"""Run an in-process vLLM engine; print each step's ground truth and every answer.

Usage: python engine_steps.py MODEL_DIR  (one JSON object on the last line)

Ground truth, independent of the emulator: which scheduled requests had not
computed their whole prompt comes from the scheduler's output (new requests'
computed counts against their prompt; cached ones against the runner's
request record), and the decision is what this script's own wrapper sees
handed to ``CudagraphDispatcher.dispatch`` (the last call of the step, as the
emulator reads it): :class:`tests.engine.emulator.step_recording.StepRecorder`.
When the emulator is loaded, its record of this process is printed too.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from vllm_graphsafe import vllm_layout

K = 3
BLOCK = 128


def ids(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(length)]


def main(model_dir: str) -> None:
    from vllm import LLM, SamplingParams

    TokensPrompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.engine.emulator.step_recording import StepRecorder

    steps = StepRecorder(dispatch_call="last").install().steps

    llm = LLM(model=model_dir, **engine_kwargs(num_speculative_tokens=K))

    def run(label: str, prompts: list[list[int]], max_tokens: int = 16) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        for index, output in enumerate(outputs):
            answers[f"{label}/{index}"] = {
                "request_id": output.request_id,
                "token_ids": list(output.outputs[0].token_ids),
                "text": output.outputs[0].text,
            }

    answers: dict[str, dict[str, Any]] = {}
    # Dangerous and not: a fresh K+1 prompt; a block prefix hit leaving K+1
    # (its warm run) and one leaving K (neighbour); two fresh K+1 together.
    run("fresh_k_plus_1", [ids(K + 1, 1)])
    boundary = ids(BLOCK + K + 1, 2)
    run("boundary_cold", [boundary])
    run("boundary_warm", [boundary])
    neighbour = ids(BLOCK + K, 3)
    run("neighbour_cold", [neighbour])
    run("neighbour_warm", [neighbour])
    run("fresh_pair", [ids(K + 1, 4), ids(K + 1, 5)])
    decode_only_from = len(steps)
    # Decode only: no prompt leaves K+1 tokens to a step; long greedy answers
    # that ngram drafts well make many genuine uniform-decode steps.
    run("decode_only", [ids(length, 10 + length) for length in (6, 9, 13)], 96)

    from vllm_graphsafe import emulator

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
                "vocab_size": llm.llm_engine.model_config.get_vocab_size(),
                "steps": steps,
                "decode_only_from": decode_only_from,
                "answers": answers,
                "emulator": record,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
