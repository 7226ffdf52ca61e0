"""What a LightningModule does that its layout cannot run, said in one line before it costs a traceback.

- Parameters that get no gradient (a GAN's other half, a head only some steps use) under DDP without
  ``find_unused_parameters``: DDP waits for every trainable parameter's gradient and fails at the *next*
  step, from every rank, with a hint naming a Lightning strategy the ``parallel`` section refuses.
  :class:`UnusedParametersCheck` looks once, after the first backward and before the first optimizer
  step, so the refused run leaves nothing behind, and names the parameters and
  ``parallel.ddp.find_unused_parameters``. Later steps are covered by :mod:`project.parallel.failures`.
- Manual optimization (``automatic_optimization = False``) with gradient accumulation, which Lightning
  refuses at ``fit`` naming ``Trainer(accumulate_grad_batches=N)``, a setting the plan wrote:
  :func:`refuse_manual_accumulation` refuses it before any process starts, naming the ``parallel`` setting.
- Lightning's StochasticWeightAveraging under a layout that shards parameters: it copies DTensor shards into a
  plain averaged copy and fails mid-training (``aten.copy_ got mixed torch.Tensor and DTensor``):
  :func:`refuse_unshardable_callbacks` says so before training.
- A ``training_step`` that returns None (skips the step) on several processes, which Lightning refuses at that
  step with a RuntimeError from every rank: :func:`skipped_step_error` makes it one line (it depends on the data,
  so it cannot be refused before training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import StochasticWeightAveraging
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
    if not isinstance(ddp, DistributedDataParallel) or ddp.find_unused_parameters or ddp.static_graph:
        return None
    return ddp


def unused_parameters_problem(trainer: L.Trainer, pl_module: L.LightningModule) -> UnusedParametersError | None:
    """After the first backward: the error for trainable parameters DDP would wait for in vain, else ``None``.

    Only under automatic optimization: a manual ``training_step`` may call backward once per optimizer,
    each on part of the model, which DDP can accept when the parts add up to the whole within the step.
    """
    ddp = _ddp_needing_every_gradient(trainer)
    if ddp is None or not pl_module.automatic_optimization:
        return None
    names = parameters_without_gradient(pl_module, ddp.parameters_to_ignore)
    if not names:
        return None
    return unused_parameters_error(
        type(pl_module).__name__, names, "the first training step", uses_parallel_section(trainer)
    )


class UnusedParametersCheck(L.Callback):
    """Refuse, after the first backward, a model whose trainable parameters DDP would wait for in vain.

    Costs nothing per step: the hook removes itself after that one look (Lightning calls only callable
    hooks, ``project.lightning_private`` item 4), or at the start of training when the run is not DDP.
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
    """Refuse gradient accumulation for a module that optimizes manually, naming the setting that asked for it.

    Args:
        model: The built module (``None``: nothing to check).
        accumulation: Micro-batches per optimizer step the Trainer would be given.
        settings: The ``parallel`` section (``None``: plain Lightning, ``trainer.accumulate_grad_batches``).
        plan: The resolved plan (its world size and per-device batch say where a derived accumulation comes from).

    Raises:
        UserError: ``accumulation`` > 1, or a plan whose steps a layer splits (``micro_batch: auto``), and
            ``model.automatic_optimization`` is False.
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
    """Refuse StochasticWeightAveraging where parameters are sharded (fsdp, tensor parallel), before training.

    Raises:
        UserError: naming the callback, why it cannot run on shards, and the layouts where it does.
    """
    if not row_of(trainer.strategy).shards_parameters:
        return
    if any(isinstance(callback, StochasticWeightAveraging) for callback in trainer.callbacks):
        raise UserError(
            "trainer.callbacks has StochasticWeightAveraging, which averages a plain copy of the module's weights, "
            "and this layout shards them (scenario fsdp or tensor parallelism: the copy fails mid-training); use "
            "scenario ddp or zero1 for SWA, or drop the callback"
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
