"""The pipeline's step: a ``torch.distributed.pipelining`` schedule (training), a forward through the stages (eval).

Each returns what every rank of the pipeline needs.

Training runs ``Schedule1F1B`` or ``ScheduleGPipe``: the first stage feeds the input, the last computes the loss of
each micro-batch (the module's ``pipeline_loss``) and the gradients are divided by the micro-batch count
(``scale_grads``), so a step equals one process's step on the whole batch. The step's loss is broadcast from the
last stage. Evaluation sends each stage's output to the next and broadcasts the last stage's output, so the
module's own ``validation_step``/``test_step``/``predict_step`` run unchanged on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

SCHEDULES = ("1f1b", "gpipe")


@dataclass
class Pipeline:
    """This rank's place in its pipeline: the stage index and count, the pipeline's group and its global ranks."""

    stage: int
    stages: int
    group: Any
    ranks: list[int]
    device: torch.device

    @property
    def is_first(self) -> bool:
        """The stage that reads the input."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """The stage that computes the loss."""
        return self.stage == self.stages - 1


def make_schedule(
    submodule: nn.Module, where: Pipeline, schedule: str, microbatches: int, loss: Callable[[Tensor, Tensor], Tensor]
) -> Any:
    """The training schedule over this rank's stage (``submodule``: the cut network)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(submodule, where.stage, where.stages, where.device, group=where.group)
    kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
    return kind(stage, n_microbatches=microbatches, loss_fn=loss, scale_grads=True)


def train_step(schedule: Any, where: Pipeline, x: Tensor, y: Tensor) -> Tensor:
    """Forward and backward of the whole batch over the micro-batches; the mean loss, on every stage."""
    losses: list[Tensor] = []
    if where.is_first:
        schedule.step(x, target=y if where.is_last else None, losses=losses, return_outputs=False)
    elif where.is_last:
        schedule.step(target=y, losses=losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)
    loss = torch.stack([value.detach() for value in losses]).mean() if where.is_last else None
    return _from_last(where, loss)


def _from_last(where: Pipeline, value: Tensor | None) -> Tensor:
    """``value`` of the last stage, on every stage of the pipeline (a tensor of any shape and dtype)."""
    meta = [(tuple(value.shape), value.dtype) if value is not None else None]
    dist.broadcast_object_list(meta, src=where.ranks[-1], group=where.group, device=where.device)
    shape, dtype = meta[0]
    if value is None:
        value = torch.empty(shape, dtype=dtype, device=where.device)
    dist.broadcast(value, src=where.ranks[-1], group=where.group)
    return value


def average_gradients(parameters: list[Tensor], group: Any, replicas: int) -> None:
    """The mean of each gradient over a stage's data-parallel replicas: one all-reduce of them all, flattened.

    DDP is not used: under GPipe (every forward, then every backward) torch 2.13's reducer asserts at the second
    step ("rebuilt parameter indices size is not same as original model parameters size": its bucket rebuild
    counts each micro-batch's gradient hook). One all-reduce after the schedule gives the same mean, not
    overlapped with the backward.
    """
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if replicas == 1 or not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, group=group)
    flat /= replicas
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


class PipelineForward(nn.Module):
    """The network as seen by evaluation: each stage's output sent to the next, the last one's given to all.

    Every rank of a pipeline calls it with the same input (they share their data); only the first stage reads it.
    """

    def __init__(self, stage: nn.Module, where: Pipeline) -> None:
        super().__init__()
        object.__setattr__(self, "stage", stage)  # not a submodule: the module's state dict stays the stage's
        object.__setattr__(self, "where", where)

    def __getattr__(self, name: str) -> Any:
        """The network's own attributes (a GPT's ``vocab``, ``block_size``), which generation reads."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["stage"], name)

    def parameters(self, recurse: bool = True) -> Any:
        """This stage's parameters (where they live: their device and dtype)."""
        return self.__dict__["stage"].parameters(recurse)

    def forward(self, x: Tensor) -> Tensor:
        """The whole network's output of ``x``, on every stage."""
        where = self.where
        if not where.is_first:
            meta: list[Any] = [None]
            dist.recv_object_list(meta, src=where.ranks[where.stage - 1], group=where.group, device=where.device)
            x = torch.empty(meta[0][0], dtype=meta[0][1], device=where.device)
            dist.recv(x, src=where.ranks[where.stage - 1], group=where.group)
        out = self.stage(x)
        if where.is_last:
            return _from_last(where, out.contiguous())
        follower = where.ranks[where.stage + 1]
        dist.send_object_list([(tuple(out.shape), out.dtype)], dst=follower, group=where.group, device=where.device)
        dist.send(out.contiguous(), dst=follower, group=where.group)
        return _from_last(where, None)
