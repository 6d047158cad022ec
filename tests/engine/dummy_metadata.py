"""Dummy runs on a real in-process vLLM engine, and a generation around them.

Usage: python dummy_metadata.py MODEL_DIR  (prints one JSON object last)

Records, at each attention-metadata build of a dummy run, the staged
sequence lengths (CPU and device mirror), computed lengths, query offsets
and positions; then checks that a generation after the dummy runs returns
the tokens it returned before them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

DUMMY_SHAPES = [
    # (num_tokens, profile_seq_lens, extra _dummy_run arguments)
    (4, 4096, {}),
    (4, 1, {}),
    (4, 4, {}),
    (12, 300, {}),
    (7, 64, {"create_mixed_batch": True}),
    (8, None, {"uniform_decode": True}),
]


def find_runner(llm: Any) -> Any:
    client = llm.llm_engine.engine_core
    executor = client.engine_core.model_executor
    return executor.driver_worker.worker.model_runner


def main(model_dir: str) -> None:
    from vllm import LLM, SamplingParams

    from vllm_graphsafe.local_engine.cpu_config import engine_kwargs

    llm = LLM(model=model_dir, **engine_kwargs(num_speculative_tokens=3))
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = ["one two three four", "the numbers go 1 2 3 4 5 6 7 8 9"]

    def generate() -> list[list[int]]:
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    before = generate()
    runner = find_runner(llm)
    snapshots: list[dict[str, Any]] = []
    original_build = runner._build_attention_metadata

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        num_reqs = kwargs["num_reqs"]
        snapshots[-1]["builds"].append(
            {
                "num_reqs_padded": num_reqs,
                "seq_lens_cpu": runner.optimistic_seq_lens_cpu[:num_reqs].tolist(),
                "seq_lens_device": runner.seq_lens[:num_reqs].cpu().tolist(),
                "num_computed": runner.input_batch.num_computed_tokens_cpu[
                    :num_reqs
                ].tolist(),
                "query_start_loc": runner.query_start_loc.np[: num_reqs + 1].tolist(),
                "positions": runner.positions[: kwargs["num_tokens"]].cpu().tolist(),
            }
        )
        return original_build(*args, **kwargs)

    runner._build_attention_metadata = recording_build
    for num_tokens, profile_len, extra in DUMMY_SHAPES:
        snapshots.append(
            {"num_tokens": num_tokens, "profile_seq_lens": profile_len, "builds": []}
        )
        runner._dummy_run(
            num_tokens, force_attention=True, profile_seq_lens=profile_len, **extra
        )
    del runner._build_attention_metadata
    after = generate()
    print(json.dumps({"snapshots": snapshots, "before": before, "after": after}))


if __name__ == "__main__":
    main(sys.argv[1])
