"""The world-size invariance, proven on this layout: DDP on every rank vs one process on the same batches.

A tiny model, seeded the same on every rank, takes a few SGD steps with momentum under
``DistributedDataParallel`` over the run's process group, each rank on its contiguous share of each
global batch; every rank also takes the same steps alone on the whole global batches. The two must end
at the same weights: that is what lets the template promise the same results at any world size, and it
fails on a layout whose collectives or devices compute something else (a broken link, a faulty device).

The training loader is checked the same way: the first global batches its ranks draw, put side by side
in rank order, must be the batches the same sampler draws on one process.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from project.parallel.collectives import gather_objects, process_group_size
from project.parallel.samplers import GlobalBatchSampler

#: Weights may differ by float32 rounding of a differently ordered sum, no more.
TOLERANCE = 1e-5
STEPS = 3
SAMPLES_PER_RANK = 4


def _tiny_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def _global_batches(world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(4321)
    size = SAMPLES_PER_RANK * world_size
    return [
        (torch.randn(size, 16, generator=generator), torch.randn(size, 4, generator=generator)) for _ in range(STEPS)
    ]


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for inputs, targets in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs.to(device)), targets.to(device)).backward()
        optimizer.step()


def weight_difference(device: torch.device, tensor_mesh: Any = None) -> float:
    """Largest absolute difference between this rank's parallel weights and its one-process weights.

    ``tensor_mesh`` (the strategy's 2-D device mesh when its tensor-parallel dimension is above 1): the tiny
    model's Linear pair is split colwise/rowwise over that dimension, and the data-parallel dimension (if above 1)
    is ``fully_shard``-ed, as the run's layout does; each data-parallel rank takes its share of the global batch.
    """
    size = process_group_size()
    tp = tensor_mesh["tensor_parallel"].size() if tensor_mesh is not None else 1
    dp_size, dp_rank = size // tp, (dist.get_rank() if size > 1 else 0) // tp
    batches = _global_batches(dp_size)
    alone = _tiny_model().to(device)
    _train(alone, batches, device)
    if size == 1:
        return 0.0
    shared = _tiny_model().to(device)
    wrapped = _tensor_parallel(shared, tensor_mesh, dp_size) if tp > 1 else _ddp(shared, device)
    share = slice(dp_rank * SAMPLES_PER_RANK, (dp_rank + 1) * SAMPLES_PER_RANK)
    _train(wrapped, [(inputs[share], targets[share]) for inputs, targets in batches], device)
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in shared.parameters()]
    return max(float((a - b).abs().max()) for a, b in zip(alone.parameters(), full))


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _tensor_parallel(model: nn.Module, mesh: Any, dp_size: int) -> nn.Module:
    """The tiny model split over the mesh's tensor-parallel dimension (and sharded over its data-parallel one)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if dp_size > 1:
        fully_shard(model, mesh=mesh["data_parallel"])
    return model


def sampler_matches_one_process(sampler: Any, batches: int = 4) -> bool | None:
    """Whether the data-parallel ranks' first ``batches`` global batches are one process's (``None``: other sampler).

    The sampler was built over the layout's data-parallel degree (``num_replicas``), not the world size: the ranks of
    one tensor-parallel group hold the same shard, which must then be the same. A copy of the installed sampler is
    iterated (the real one keeps its resume point for training).
    """
    if not isinstance(sampler, GlobalBatchSampler):
        return None
    mine = copy.copy(sampler)
    mine.resume_point = None
    count = min(batches, mine.num_global_batches)
    drawn_by_rank = gather_objects((mine.rank, list(itertools.islice(iter(mine), count * mine.batch_size))))
    shards: dict[int, list[Any]] = {}
    for dp_rank, shard in drawn_by_rank:
        if shards.setdefault(dp_rank, shard) != shard:
            return False  # two ranks of one data-parallel rank drew different samples
    if sorted(shards) != list(range(mine.num_replicas)):
        return False
    alone = GlobalBatchSampler(
        sampler.dataset,
        sampler.samples_per_micro_step,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
        with_epoch=sampler.with_epoch,
    )
    alone.set_epoch(sampler.epoch)
    expected = list(itertools.islice(iter(alone), count * alone.batch_size))
    b = mine.batch_size
    drawn = [index for k in range(count) for r in range(mine.num_replicas) for index in shards[r][k * b : (k + 1) * b]]
    return drawn == expected
