"""The replica guard's checksums (project/extras/guards/replicas.py): any changed bit changes them, equal tensors agree,
and the replica rows say which ranks compare (no collective where no row holds two ranks)."""

from __future__ import annotations

import pytest
import torch

from project.extras.guards.replicas import ReplicaRows, checksum, first_disagreement


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_equal_tensors_agree_and_one_changed_element_or_a_swap_does_not(dtype):
    base = (torch.arange(1000) % 7).to(dtype) if dtype is not torch.bool else torch.arange(1000) % 2 == 0
    assert checksum(base) == checksum(base.clone())
    changed = base.clone()
    changed[517] = ~changed[517] if dtype is torch.bool else changed[517] + 1
    assert checksum(changed) != checksum(base)
    swapped = base.clone()
    swapped[[3, 4]] = base[[4, 3]]
    assert bool(base[3] != base[4]) and checksum(swapped) != checksum(base)


def test_a_one_ulp_drift_changes_the_checksum_and_chunks_do_not():
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    drifted = weights.clone()
    drifted[1, 2] = torch.nextafter(drifted[1, 2], torch.tensor(float("inf")))
    assert checksum(drifted) != checksum(weights)
    assert checksum(weights) == checksum(weights.t().contiguous().t())  # layout does not matter, values do
    assert 0 <= int(checksum(torch.full((10,), -1.0))) < 2**62  # its negation fits an int64


@pytest.mark.parametrize(
    ("world", "dp_shard", "tp", "sharded", "rows", "compares"),
    [(2, 1, 1, False, 1, True), (4, 1, 2, False, 2, True), (2, 1, 2, False, 2, False), (2, 2, 1, True, 2, False),
     (4, 2, 1, True, 2, True), (1, 1, 1, False, 1, False)],
    ids=["ddp", "dp2-tp2", "tp2", "fsdp", "hsdp", "one"],
)  # fmt: skip
def test_replica_rows_of_each_layout(world, dp_shard, tp, sharded, rows, compares):
    layout = ReplicaRows.of(world, dp_shard, tp, sharded)
    assert (layout.rows, layout.compares) == (rows, compares)
    if not compares:  # nothing to compare: no collective, not even outside a process group
        assert first_disagreement([checksum(torch.ones(2))], 0, layout) is None
