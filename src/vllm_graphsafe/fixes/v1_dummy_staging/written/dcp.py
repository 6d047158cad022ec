"""Written after ``staging.py`` where the tree has the DCP dummy context helper."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_graphsafe.fixes.v1_dummy_staging.written.staging import (
        MAX_TOKENS,
        SimpleNamespace,
        _runner,
        _stage,
        np,
        torch,
    )


class _RecordingBlockTables:
    def __init__(self) -> None:
        table = SimpleNamespace(
            max_num_blocks_per_req=4,
            blocks_per_kv_block=1,
            add_row=lambda block_ids, row: None,
            commit_block_table=lambda num_reqs: None,
        )
        self.block_tables = [table]
        self.slot_mapping_positions: list[list[int]] = []

    def commit_block_table(self, num_reqs: int) -> None:
        pass

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None:
        self.slot_mapping_positions.append(positions.tolist())


def test_dcp_helper_consumes_the_staged_positions() -> None:
    from vllm.v1.worker.cp_utils import prepare_dcp_dummy_context_metadata

    dcp_context_len = 8
    scheduled = [4, 3]
    runner = _runner([4 + dcp_context_len] * 2)
    _stage(runner, scheduled)
    staged = runner.positions[:7].tolist()
    block_tables = _RecordingBlockTables()
    query_pos = SimpleNamespace(
        np=np.zeros(MAX_TOKENS, dtype=np.int64),
        gpu=torch.zeros(MAX_TOKENS, dtype=torch.int64),
        copy_to_gpu=lambda *args: None,
    )
    query_start_loc = SimpleNamespace(gpu=torch.tensor([0, 4, 7]))

    prepare_dcp_dummy_context_metadata(
        input_batch=SimpleNamespace(block_table=block_tables),
        kv_cache_config=SimpleNamespace(num_blocks=16),
        query_pos=query_pos,
        positions=runner.positions,
        query_start_loc=query_start_loc,
        num_reqs=2,
        num_tokens_unpadded=7,
        dcp_dummy_context_len=dcp_context_len,
    )

    assert runner.positions[:7].tolist() == staged
    assert staged[4:] == [9, 10, 11]
    assert block_tables.slot_mapping_positions == [staged]
