"""Written after ``dispatch.py`` where the tree's dispatch is handed the step."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.v1_phase_dispatch.written.dispatch import (
        NO_DRAFTS,
        Callable,
        GPUModelRunner,
        SimpleNamespace,
        _runner,
        inspect,
        pytest,
    )


# Under pipeline + sequence parallelism this tree's worker dispatches before the
# runner updates its request state: every dispatch reads the scheduler output.

#: Whether this tree counts a row's drafts once past its prompt (else where it
#: schedules exactly 1 + its drafts); set by the backport.
DRAFTS_COUNT_PAST_PROMPT = False

Request = tuple[str, bool, int, int, int, int | None]


def _step(requests: list[Request]) -> SimpleNamespace:
    new = [r for r in requests if r[1]]
    cached = [r for r in requests if not r[1]]
    return SimpleNamespace(
        num_scheduled_tokens={r[0]: r[4] for r in requests},
        total_num_scheduled_tokens=sum(r[4] for r in requests),
        scheduled_spec_decode_tokens={
            r[0]: [-1] * r[5] for r in requests if r[5] is not None
        },
        scheduled_new_reqs=[
            SimpleNamespace(
                req_id=r[0],
                num_computed_tokens=r[2],
                prompt_token_ids=[0] * r[3],
                prompt_embeds=None,
            )
            for r in new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r[0] for r in cached],
            num_computed_tokens=[r[2] for r in cached],
        ),
    )


def _is_scheduled_decode(request: Request, decode_query_len: int) -> bool:
    _, _, num_computed, num_prompt, num_scheduled, num_drafts = request
    if decode_query_len == 1:
        return num_computed > 0
    if num_drafts != decode_query_len - 1:
        return False
    if DRAFTS_COUNT_PAST_PROMPT:
        return num_computed >= num_prompt
    return num_scheduled == num_drafts + 1


def _stale_runner(requests: list[Request], decode_query_len: int) -> GPUModelRunner:
    """A runner whose columns say the opposite of the step's answer."""
    decodes = all(_is_scheduled_decode(r, decode_query_len) for r in requests)
    stale = (0, NO_DRAFTS) if decodes else (50, decode_query_len - 1)
    runner = _runner([stale] * len(requests), decode_query_len)
    runner.requests = {
        r[0]: SimpleNamespace(num_prompt_tokens=r[3]) for r in requests if not r[1]
    }
    return runner


# (req_id, is_new, num_computed, num_prompt, num_scheduled, num_drafts or None).
STEP_CASES: dict[str, Callable[[int], list[Request]]] = {
    "fresh_prompt": lambda q: [("new", True, 0, q, q, None)],
    "prefix_cache_hit": lambda q: [("hit", True, 64, 64 + q, q, None)],
    "reprefill_after_preemption": lambda q: [("resumed", False, 17, 10, q, None)],
    "decodes": lambda q: [(f"d{i}", False, 25 + i, 10, q, q - 1) for i in range(3)],
    "decode_and_a_fresh_prompt": lambda q: [
        ("d", False, 25, 10, q, q - 1),
        ("new", True, 0, q, q, None),
    ],
    "padded_prompt_tail": lambda q: [
        ("d", False, 25, 10, q, q - 1),
        ("tail", True, 128, 129, q, q - 1),
    ],
}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
@pytest.mark.parametrize("num_speculative_tokens", [0, 1, 3])
def test_a_step_is_classified_from_its_scheduler_output(
    case: str, num_speculative_tokens: int
) -> None:
    q = num_speculative_tokens + 1
    requests = STEP_CASES[case](q)
    runner = _stale_runner(requests, q)

    has_prefill = runner._has_prefill_request(len(requests), _step(requests))

    assert has_prefill == (not all(_is_scheduled_decode(r, q) for r in requests))


def test_the_runner_hands_the_step_to_its_own_dispatch() -> None:
    import ast
    import textwrap

    source = textwrap.dedent(inspect.getsource(GPUModelRunner.execute_model))
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "_determine_batch_execution_and_padding"
    ]
    assert len(calls) == 1
    assert [
        keyword.value.id
        for keyword in calls[0].keywords
        if keyword.arg == "scheduler_output" and isinstance(keyword.value, ast.Name)
    ] == ["scheduler_output"]
