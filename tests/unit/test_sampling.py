"""World-size-invariant training batches and exactly-once evaluation shards."""

from __future__ import annotations

import pytest

from project.parallel.samplers import EvalShardSampler, GlobalBatchSampler


def global_batches(n: int, global_batch: int, world: int, epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
    per_rank = []
    for rank in range(world):
        sampler = GlobalBatchSampler(range(n), global_batch // world, num_replicas=world, rank=rank, shuffle=shuffle)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        b = global_batch // world
        per_rank.append([indices[i : i + b] for i in range(0, len(indices), b)])
    # Global batch k = rank 0's k-th slice, then rank 1's, ...
    return [[i for r in range(world) for i in per_rank[r][k]] for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("epoch", [0, 3])
def test_global_batches_do_not_depend_on_world_size(world, epoch):
    assert global_batches(103, 16, world, epoch) == global_batches(103, 16, 1, epoch)


def test_epochs_reshuffle_and_incomplete_global_batch_is_dropped():
    first, second = global_batches(103, 16, 2, 0), global_batches(103, 16, 2, 1)
    assert first != second
    assert len(first) == 103 // 16 and all(len(b) == 16 for b in first)
    assert len({i for batch in first for i in batch}) == 16 * (103 // 16)


def test_rank_takes_contiguous_slice_of_each_global_batch():
    whole = global_batches(64, 16, 1)
    rank1 = list(GlobalBatchSampler(range(64), 8, num_replicas=2, rank=1))
    assert rank1[:8] == whole[0][8:16]


def test_resume_point_skips_only_the_resumed_epoch():
    sampler = GlobalBatchSampler(range(64), 8, num_replicas=2, rank=0)
    full = list(sampler)
    sampler.set_epoch(0)
    sampler.resume_point = (0, 2)
    assert len(sampler) == 32  # the whole epoch: Lightning counts a resumed epoch on from where it stopped
    assert list(sampler) == full[16:]
    assert list(sampler) == full  # used once


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one global batch of 32"):
        GlobalBatchSampler(range(10), 16, num_replicas=2, rank=0)


@pytest.mark.parametrize(("n", "world"), [(270, 2), (270, 4), (7, 3), (2, 4)])
def test_eval_shards_cover_every_sample_exactly_once(n, world):
    seen = [i for rank in range(world) for i in EvalShardSampler(range(n), num_replicas=world, rank=rank)]
    assert seen == list(range(n))
    sizes = [len(EvalShardSampler(range(n), num_replicas=world, rank=r)) for r in range(world)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
