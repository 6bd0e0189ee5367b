"""chorus.torch: every operation against gloo's result, 4 ranks under torchrun (c10d
rendezvous)."""

import json
import sys

import pytest

from torch_jobs.launch import require_torch, torchrun

require_torch(__name__)

EXPECTED = {
    "all_reduce", "all_reduce_blocking_work", "all_reduce_avg_premul", "all_reduce_bool_complex", "all_reduce_async_future",
    "all_reduce_coalesced", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "all_gather_coalesced", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce", "gather", "scatter",
    "all_to_all_single", "all_to_all_single_uneven", "all_to_all", "send_recv", "isend_irecv",
    "batch_isend_irecv", "barrier", "object_collectives", "new_group", "unsupported_ops",
}


@pytest.mark.timeout(300)
def test_every_op_matches_gloo(tmp_path):
    torchrun("ops.py", 4, tmp_path, rdzv="c10d", timeout=180)
    checked = set(json.loads((tmp_path / "ops.json").read_text()))
    assert checked == EXPECTED, EXPECTED ^ checked
    made = json.loads((tmp_path / "new_group.json").read_text())
    print(
        f"new_group on 3 of 4 ranks: split {made['split'] * 1e3:.1f} ms, through the store "
        f"{made['rendezvous'] * 1e3:.1f} ms (members only: {made['local'] * 1e3:.1f} ms)",
        file=sys.stderr,
    )
