"""Every rank's value of a tensor, stacked in rank order: one all-gather (the barrier's and the layers' checks')."""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from project.parallel.collectives import in_process_group


def gather_ranks(trainer: L.Trainer, tensor: Tensor) -> Tensor:
    """``tensor`` of every rank, stacked in rank order (``[world_size, *shape]``): one all-gather."""
    if trainer.world_size == 1:
        return tensor.unsqueeze(0)
    if not in_process_group():
        return trainer.strategy.all_gather(tensor).reshape(trainer.world_size, *tensor.shape)
    # torch.distributed's own: Lightning's all_gather goes through a function torch 2.13 warns is deprecated.
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)
