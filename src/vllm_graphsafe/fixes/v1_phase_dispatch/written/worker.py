"""Written after ``scheduled_step.py`` where the tree's worker dispatches early."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.v1_phase_dispatch.written.dispatch import (
        GPUModelRunner,
        SimpleNamespace,
        _answer_of_the_dispatch,
        pytest,
    )
    from vllm_graphsafe.fixes.v1_phase_dispatch.written.scheduled_step import (
        STEP_CASES,
        _is_scheduled_decode,
        _stale_runner,
        _step,
    )


from vllm.v1.worker.gpu_worker import Worker  # noqa: E402


def _worker(runner: GPUModelRunner) -> Worker:
    worker = object.__new__(Worker)
    worker.__dict__.update(
        _pp_send_work=[],
        vllm_config=SimpleNamespace(
            parallel_config=SimpleNamespace(
                pipeline_parallel_size=2, tensor_parallel_size=1
            ),
            compilation_config=SimpleNamespace(
                pass_config=SimpleNamespace(enable_sp=True)
            ),
        ),
        use_v2_model_runner=False,
        model_runner=runner,
    )
    return worker


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_the_worker_classifies_the_step_it_is_about_to_run(case: str) -> None:
    q = 4
    requests = STEP_CASES[case](q)
    worker = _worker(_stale_runner(requests, q))

    every_request_decodes = all(_is_scheduled_decode(r, q) for r in requests)

    uniform_decode = _answer_of_the_dispatch(
        lambda: Worker.execute_model(worker, _step(requests))
    )

    assert worker.model_runner._has_prefill_request(len(requests), _step(requests)) == (
        not every_request_decodes
    )
    assert uniform_decode == every_request_decodes
