"""Written after ``dispatch.py`` where the tree names the helper as 1Cat-vLLM does."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.written.dispatch import pytest


@pytest.mark.parametrize("has_prefill", [True, False])
def test_decode_token_count_helper(has_prefill: bool) -> None:
    from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_decode_token_count

    expected = None if has_prefill else 4
    assert get_uniform_decode_token_count(3, 12, 4, has_prefill) == expected
    assert get_uniform_decode_token_count(2, 9, 5, has_prefill) is None
    assert get_uniform_decode_token_count(0, 0, 0, has_prefill) is None
