"""Replica agreement: a silent divergence of the data-parallel replicas stops the run in one line, unsaved.

Before every checkpoint is written and at the end of fit, the replicas compare their parameters and optimizer
state.

DDP keeps the replicas equal only while every rank applies the same all-reduced gradients to the same weights:
a parameter outside DDP's reducer (made trainable after DDP was built), a rank-dependent update in a callback, a
broken collective or a bit flip lets them drift apart without an error, and the checkpoint then holds rank 0's
weights only. Each rank folds each tensor's bits into one number (:mod:`.replicas`) and one
all-reduce per save compares them; nothing runs on the other steps. A disagreement raises
:class:`ReplicasDivergedError` from the checkpoint's ``on_save_checkpoint``, which every rank runs before anything
is written, so the diverged state is never saved and the newest checkpoint stays the previous one.

What is compared: every parameter (its local shard under FSDP or tensor parallelism) and, unless each rank holds
its own part of it (zero1), every tensor of the optimizers' state, among the ranks that should hold the same
ones (:class:`~.replicas.ReplicaRows`). Buffers are not: without ``broadcast_buffers`` each rank's
BatchNorm statistics are its own by design.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch.distributed as dist
from torch import Tensor

from project.errors import RunFailure
from project.extras.guards.nonfinite import _latest_checkpoint
from project.extras.guards.replicas import ReplicaRows, first_disagreement, state_checksums
from project.parallel.collectives import process_group_size
from project.parallel.strategies import row_of
from project.plan.resolve import Plan


class ReplicasDivergedError(RunFailure):
    """The data-parallel replicas hold different weights or optimizer state; every rank raises it alike."""

    said_by_rank_zero = True


def _named_state(pl_module: L.LightningModule, optimizers: list[Any], with_optimizer: bool) -> Iterator[tuple]:
    """(name, tensor) of every parameter, then of every tensor in the optimizers' state, in a fixed order."""
    names = {id(param): name for name, param in pl_module.named_parameters()}
    yield from ((f"parameter '{name}'", param) for name, param in pl_module.named_parameters())
    if not with_optimizer:
        return
    for index, optimizer in enumerate(optimizers):
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                for key in sorted(k for k, v in state.items() if isinstance(v, Tensor)):
                    where = f"parameter '{names.get(id(param), '?')}'"
                    yield f"optimizer {index}'s state '{key}' of {where}", state[key]


class ReplicaGuard(L.Callback):
    """Compare the replicas' training state at every save and at the end of fit (one all-reduce each).

    Args:
        plan: The run's plan (its layout's degrees say which ranks are replicas); ``None`` with ``parallel: null``.
    """

    def __init__(self, plan: Plan | None = None) -> None:
        self.plan = plan
        self._checked_step: int | None = None

    def _rows(self, trainer: L.Trainer) -> ReplicaRows:
        """Which ranks must agree under this run's strategy and layout."""
        sharded = row_of(trainer.strategy).shards_parameters
        # The process group's size, not the Trainer's: an elastic survivor saves alone in a world of one.
        world = process_group_size()
        if self.plan is None:  # a strategy given as trainer.strategy: its layout is unknown when it shards
            return ReplicaRows(rows=world if sharded else 1, world=world)
        layout = self.plan.layout
        if layout.pp > 1:  # each stage holds other tensors: its replicas compare over their own group (check)
            return ReplicaRows(rows=1, world=layout.dp_size)
        return ReplicaRows.of(world, layout.dp_shard, layout.tp, sharded)

    def check(self, trainer: L.Trainer, when: str) -> None:
        """Raise :class:`ReplicasDivergedError` when the replicas differ; once per optimizer step.

        Raises:
            ReplicasDivergedError: naming the first tensor that differs, the step, and the newest checkpoint.
        """
        rows = self._rows(trainer)
        step = trainer.global_step
        if step == self._checked_step or not rows.compares:
            return
        self._checked_step = step
        row = row_of(trainer.strategy)
        with_optimizer = not (row.shards_optimizer_state and not row.shards_parameters)  # zero1: partitions
        named = _named_state(trainer.lightning_module, trainer.optimizers, with_optimizer)
        names, sums = state_checksums(named)
        group = getattr(trainer.strategy, "replica_group", None)  # a pipeline stage's data-parallel replicas
        index = first_disagreement(sums, dist.get_rank(group), rows, group)
        if index is None:
            return
        newest = _latest_checkpoint(trainer)
        kept = f"the newest checkpoint is still {newest}" if newest else "no checkpoint was written yet"
        raise ReplicasDivergedError(
            f"the data-parallel replicas diverged by step {step}: {names[index]} differs between ranks, found "
            f"{when}; {kept}. A callback or hook that changes weights on one rank, or trainable parameters DDP "
            "does not all-reduce, cause this (docs/extras/guards.md#replica-agreement)"
        )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Every rank builds every checkpoint before it is written: a diverged state is stopped here, unsaved."""
        if trainer.state.fn == "fit":
            self.check(trainer, f"before the checkpoint of step {trainer.global_step} was written (it was not)")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The steps after the last save are compared too."""
        self.check(trainer, "at the end of training")
