"""Whether the training's tensors are finite, with the same verdict on every rank and at the least cost.

The non-finite loss check (:mod:`.nonfinite`) reads these once per step or once per window:
one host sync for tensors every rank holds alike, one all-reduce for sharded ones (the core's
:func:`project.callbacks.finite.gather_ranks` names the rank(s) a bad value came from).
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from project.parallel.collectives import in_process_group
from project.parallel.strategies import row_of


def all_finite(tensors: list[Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite: whether their sum is (one host sync).

    A nan or inf anywhere makes the sum nan or inf; finite values overflow its float32 only past 3e38 (the norm
    this replaces squared them, overflowing past 1e19). Summing costs a third of the norm's time, and
    ``math.isfinite(x.item())`` under a microsecond where ``torch.isfinite`` on one number costs 20 us.
    """
    if not tensors:
        return True
    return math.isfinite(torch.stack([tensor.sum(dtype=torch.float32) for tensor in tensors]).sum().item())


def sharded_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether tensors each rank holds its own part of (FSDP shards, pipeline stages) are finite on every rank.

    Each rank holds its shard, so a nan may sit in one rank's shard only: each rank checks its own and the
    verdicts are all-reduced (one one-element collective), so all ranks agree.
    """
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    norm = torch.nn.utils.get_total_norm(local, norm_type=2.0, foreach=True)
    bad = (~torch.isfinite(norm)).float().reshape(1)
    if in_process_group():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())


def weights_finite(trainer: L.Trainer) -> bool:
    """Whether the module's parameters are finite: the same verdict on every rank, since DDP keeps them equal.

    Sharded (FSDP) parameters differ per rank: each checks its shard and the verdicts are all-reduced.
    """
    params = [param.detach() for param in trainer.lightning_module.parameters()]
    return sharded_finite(params) if row_of(trainer.strategy).shards_parameters else all_finite(params)
