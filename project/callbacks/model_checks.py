"""What a LightningModule does that its layout cannot run, said in one line before it costs a traceback.

Lightning's or torch's own error would come from every rank mid-training, or name a setting the plan wrote or the
``parallel`` section refuses (``Trainer(accumulate_grad_batches=N)``, a Lightning strategy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder, StochasticWeightAveraging
from torch.nn.parallel import DistributedDataParallel

from project.errors import UserError
from project.parallel.failures import (
    UnusedParametersError,
    defer_to_rank_zero,
    parameters_without_gradient,
    unused_parameters_error,
    uses_parallel_section,
)
from project.parallel.strategies import row_of

if TYPE_CHECKING:
    from project.plan.config import ParallelConfig
    from project.plan.resolve import Plan


def _ddp_needing_every_gradient(trainer: L.Trainer) -> DistributedDataParallel | None:
    """The DDP wrapper when it expects a gradient for every trainable parameter in every step, else ``None``."""
    ddp = trainer.strategy.model
    every = isinstance(ddp, DistributedDataParallel) and not (ddp.find_unused_parameters or ddp.static_graph)
    return ddp if every else None


def unused_parameters_problem(trainer: L.Trainer, pl_module: L.LightningModule) -> UnusedParametersError | None:
    """After the first backward: the error for trainable parameters DDP would wait for in vain, else ``None``.

    Only under automatic optimization (a manual step may backward parts of the model that add up within the step).
    """
    ddp = _ddp_needing_every_gradient(trainer)
    if ddp is None or not pl_module.automatic_optimization:
        return None
    names = parameters_without_gradient(pl_module, ddp.parameters_to_ignore)
    module, parallel = type(pl_module).__name__, uses_parallel_section(trainer)
    return unused_parameters_error(module, names, "the first training step", parallel) if names else None


class UnusedParametersCheck(L.Callback):
    """Refuse, after the first backward, a model whose trainable parameters DDP would wait for in vain.

    DDP would fail at the *next* step, from every rank. The hook removes itself after one look: nothing per step.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Not DDP waiting for every gradient (one process, FSDP, find_unused_parameters): nothing to look at."""
        if _ddp_needing_every_gradient(trainer) is None or not pl_module.automatic_optimization:
            self.on_after_backward = None  # type: ignore[assignment]

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Name the parameters the first backward gave no gradient, before the optimizer steps."""
        self.on_after_backward = None  # type: ignore[assignment]  # once: the first step shows the graph
        error = unused_parameters_problem(trainer, pl_module)
        if error is not None:
            defer_to_rank_zero(trainer)
            raise error


def refuse_manual_accumulation(
    model: L.LightningModule | None, accumulation: int, settings: ParallelConfig | None, plan: Plan | None
) -> None:
    """Refuse (``UserError``) gradient accumulation for a module that optimizes manually, naming the setting.

    ``settings``: the ``parallel`` section (``None``: plain Lightning); a plan split in-step accumulates too.
    """
    if model is None or model.automatic_optimization:
        return
    if plan is not None and plan.splits_in_step:  # the microbatch layer's auto: its trial steps and split steps
        raise UserError(
            f"parallel.micro_batch={plan.micro_batch!r} tries steps of the module and accumulates its gradients, "
            f"which needs automatic optimization, and {type(model).__name__} sets `automatic_optimization = False`; "
            "set parallel.micro_batch to a number (its training_step steps its optimizers itself)"
        )
    if accumulation <= 1:
        return
    if settings is None or plan is None:
        setting, fix = f"trainer.accumulate_grad_batches={accumulation}", "drop trainer.accumulate_grad_batches"
    elif settings.accumulation is not None:
        setting, fix = f"parallel.accumulation={accumulation}", "set parallel.accumulation: 1"
    else:  # decided by global_batch_size over per_device_batch_size x the data-parallel size
        one_step = (plan.per_device_batch_size or 0) * plan.dp_size
        setting = (
            f"parallel.global_batch_size={plan.global_batch_size} (per_device_batch_size {plan.per_device_batch_size}"
            f" x {plan.layout.dp_size_name} {plan.dp_size} x accumulation {accumulation})"
        )
        fix = f"set parallel.global_batch_size: {one_step} (or drop per_device_batch_size)"
    raise UserError(
        f"{setting} accumulates gradients over {accumulation} batches per optimizer step, which Lightning does "
        f"only under automatic optimization, and {type(model).__name__} sets `automatic_optimization = False`; "
        f"{fix}, and if it should accumulate, step its optimizers every {accumulation} batches in training_step"
    )


def refuse_unshardable_callbacks(trainer: L.Trainer) -> None:
    """Refuse (``UserError``) StochasticWeightAveraging where parameters are sharded (fsdp, tensor parallel)."""
    swa = any(isinstance(callback, StochasticWeightAveraging) for callback in trainer.callbacks)
    if row_of(trainer.strategy).shards_parameters and swa:
        raise UserError(
            "trainer.callbacks has StochasticWeightAveraging, which averages a plain copy of the module's weights, "
            "and this layout shards them (scenario fsdp or tensor parallelism: the copy fails mid-training); use "
            "scenario ddp or zero1 for SWA, or drop the callback"
        )


def refuse_rank_local_finders(trainer: L.Trainer) -> None:
    """Refuse LearningRateFinder/BatchSizeFinder on several processes of the parallel section, before training.

    Each reads rank 0's loss (on its share of each global batch) or grows the per-process batch the plan fixed, so
    the same model would get another suggestion at another world size.
    """
    if trainer.world_size == 1 or not uses_parallel_section(trainer):
        return
    for callback in trainer.callbacks:
        if isinstance(callback, (LearningRateFinder, BatchSizeFinder)):
            name = type(callback).__name__
            raise UserError(
                f"trainer.callbacks has {name} on {trainer.world_size} processes: it tunes on rank 0's share of each "
                "global batch, so its suggestion depends on the world size; run it on one process "
                "(--parallel.devices 1) and set what it suggests in the config, or drop the callback"
            )


def skipped_step_error(error: BaseException, trainer: L.Trainer) -> UserError | None:
    """Lightning's refusal of a ``training_step`` that returned None on several processes, as one line; else None."""
    if not (isinstance(error, RuntimeError) and "returning None in distributed training" in str(error)):
        return None
    return UserError(
        f"{type(trainer.lightning_module).__name__}.training_step returned None at step {trainer.global_step} "
        f"(epoch {trainer.current_epoch}) on {trainer.world_size} processes, which Lightning does not support (a "
        "rank skipping its backward while the others run theirs would hang DDP); return a loss that skips nothing "
        "instead (e.g. `loss * 0` keeps the graph and changes no weight), or train on one process"
    )
