"""Written after ``dispatch.py`` where the tree names the helper as upstream does."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.mrv2_phase_dispatch.written.dispatch import pytest


@pytest.mark.parametrize("eligible", [True, False])
def test_decode_token_count_helper(eligible: bool) -> None:
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    expected = 4 if eligible else None
    assert get_uniform_decode_token_count(3, 12, 4, eligible) == expected
    assert get_uniform_decode_token_count(2, 9, 5, eligible) is None
    assert get_uniform_decode_token_count(0, 0, 0, eligible) is None
