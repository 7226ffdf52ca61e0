"""Whether the data-parallel replicas hold the same training state: one checksum per tensor, one all-reduce.

Every tensor's bits (not its values: a 1-ulp drift counts) are folded into one int64 with position weights, so
the ranks compare a vector of a few hundred numbers instead of the weights. A rank compares only with the ranks
that should hold the same tensors: those of its *replica row*. Under DDP every rank is in one row; under tensor
parallelism (``tp`` consecutive ranks share their data) the ranks with the same tensor-parallel coordinate form
one row each; under FSDP the ranks holding the same shard (HSDP's replicas) do. A row of one rank compares
nothing, and a layout whose rows are all single ranks runs no collective at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

#: Elements folded at a time: bounds the int64 temporaries of one huge tensor to 128 MiB.
CHUNK = 1 << 24
#: Checksums keep 62 bits, so that their negation fits an int64 and one MAX finds both extremes.
MASK = (1 << 62) - 1
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def local_tensor(tensor: Tensor) -> Tensor:
    """The part of ``tensor`` this rank holds (a DTensor's local shard), detached."""
    to_local = getattr(tensor, "to_local", None)  # a DTensor (FSDP, tensor parallel)
    return (to_local() if callable(to_local) else tensor).detach()


def checksum(tensor: Tensor) -> Tensor:
    """An int64 (0-d, on the tensor's device) that changes when any bit of any element of ``tensor`` does."""
    flat = local_tensor(tensor).reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    bits = flat.contiguous().view(_BITS[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), CHUNK):
        part = bits[start : start + CHUNK].to(torch.int64)
        # Position weights: two elements swapped, or one changed, change the sum (int64 arithmetic wraps alike).
        weights = torch.arange(start + 1, start + 1 + part.numel(), dtype=torch.int64, device=flat.device)
        total += (part * weights).sum() + part.sum()
    return total & MASK


@dataclass(frozen=True)
class ReplicaRows:
    """Which ranks must agree: ``rows`` groups, rank ``r`` in row ``r % rows``; ``world`` ranks in all."""

    rows: int
    world: int

    @classmethod
    def of(cls, world: int, dp_shard: int = 1, tp: int = 1, sharded: bool = False) -> ReplicaRows:
        """The rows of a layout: DDP one row; tensor parallel one per tp coordinate; FSDP one per shard too."""
        rows = tp * (dp_shard if sharded else 1)
        return cls(rows=rows, world=world)

    @property
    def compares(self) -> bool:
        """Whether any row holds two ranks or more (else there is nothing to compare, and no collective)."""
        return self.world > self.rows


def first_disagreement(checksums: list[Tensor], rank: int, rows: ReplicaRows, group: Any = None) -> int | None:
    """The index of the first checksum on which the ranks of some replica row differ, else ``None``.

    One all-reduce (MAX) of a ``[rows, 2 x n]`` int64 matrix: each rank writes ``[c, -c]`` into its own row, so
    the result holds every row's largest and smallest checksum; the answer is the same on every rank.
    """
    if not checksums or not rows.compares:
        return None
    own = torch.stack(checksums)
    matrix = torch.full((rows.rows, 2 * own.numel()), torch.iinfo(torch.int64).min, dtype=torch.int64)
    matrix = matrix.to(own.device)
    matrix[rank % rows.rows] = torch.cat([own, -own])
    dist.all_reduce(matrix, op=dist.ReduceOp.MAX, group=group)
    highest, lowest = matrix[:, : own.numel()], -matrix[:, own.numel() :]
    differs = (highest != lowest).any(dim=0).nonzero()
    return int(differs[0]) if differs.numel() else None


def state_checksums(named: Iterable[tuple[str, Tensor]]) -> tuple[list[str], list[Tensor]]:
    """The names and checksums of ``named`` tensors, in order."""
    names, sums = [], []
    for name, tensor in named:
        names.append(name)
        sums.append(checksum(tensor))
    return names, sums
