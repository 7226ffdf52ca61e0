"""A non-finite training loss (nan, inf): stop with the step named, or skip that step's update.

Every rank must take the same decision, or the ranks that go on wait forever in the next gradient
all-reduce for the ones that stopped. The verdict is therefore read from the gradients after DDP's
all-reduce, which are the same on every rank (a nan loss on one rank makes everyone's gradients nan),
so agreeing costs no collective per step; only when a step is bad are the ranks' losses gathered, to
name the rank(s) it came from. That reads one number per step on the host (a sync on a GPU).

With ``check_every_n_steps: N`` > 1 (``stop`` only) nothing is read per step: each rank keeps its losses
on the device, and every N optimizer steps, before every checkpoint is written and at the end of
training one process reads the sum of its losses, several processes the sum of the weights: DDP keeps
the weights equal on every rank and a non-finite update makes them non-finite everywhere, so the ranks
agree with no collective (sharded FSDP weights: one all-reduce of the shards' verdicts). Only when it
is bad are the ranks' losses gathered, to name the first bad step and its rank(s). Up to N non-finite
updates may be applied before the run stops, but no checkpoint ever holds them (the save itself stops
the run).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from project.callbacks.finite import gather_ranks
from project.checkpoints import pending
from project.errors import RunFailure, UserError
from project.extras.guards.finite import all_finite, sharded_finite, weights_finite
from project.parallel.strategies import row_of

ACTIONS = ("stop", "skip")
log = logging.getLogger(__name__)


class NonFiniteLossError(RunFailure):
    """The training loss was nan or inf; the message names the step and the rank(s)."""


def _latest_checkpoint(trainer: L.Trainer) -> str | None:
    """The newest checkpoint file this run wrote, if any."""
    pending.wait_for()  # a checkpoint still being written in the background: name it once it is complete
    paths = {
        Path(p)
        for cb in trainer.callbacks
        if isinstance(cb, ModelCheckpoint)
        for p in (cb.last_model_path, cb.best_model_path)
        if p and Path(p).exists()  # a sharded (FSDP) checkpoint is a folder
    }
    return str(max(paths, key=lambda p: p.stat().st_mtime)) if paths else None


class NonFiniteLossCallback(L.Callback):
    """Check the training loss before every optimizer step, on every rank, and agree on what to do.

    Args:
        action: ``stop``: end the run with an error naming the step and rank; the update is never
            applied, so the checkpoints already written are the last good weights. ``skip``: drop
            that step's update (the parameters and the buffers, e.g. BatchNorm statistics, stay as
            they were before the step) and go on; each skip is a warning and counts in
            ``train/skipped_steps``.
        check_every_n_steps: 1: check before every update (as above). N > 1: no host sync per step; the
            check runs every N steps and before every checkpoint (the losses of one process, the weights
            of several), so up to N non-finite updates may be applied, never saved (``stop`` only: a skip
            must come before the update).
    """

    def __init__(self, action: str = "stop", check_every_n_steps: int = 1) -> None:
        if action not in ACTIONS:
            raise ValueError(f"NonFiniteLossCallback action={action!r} is not one of {', '.join(ACTIONS)}")
        if check_every_n_steps < 1:
            raise ValueError(f"NonFiniteLossCallback check_every_n_steps={check_every_n_steps} must be >= 1")
        if action == "skip" and check_every_n_steps != 1:
            raise ValueError(
                f"NonFiniteLossCallback action: skip needs check_every_n_steps: 1 (got {check_every_n_steps}): "
                "a step's update can only be dropped before it is applied; use action: stop with N > 1"
            )
        self.action = action
        self.check_every_n_steps = check_every_n_steps
        # check_every_n_steps > 1: (step, epoch, this rank's loss) of each optimizer step since the last
        # check; the losses stay device tensors, nothing is read.
        self._window: list[tuple[int, int, Tensor]] = []
        self.skipped = 0
        # The loss this rank reports for the current optimizer step: the first non-finite one of its
        # accumulated micro-batches, else the latest. Kept on the device: no sync until the step.
        self._loss: Tensor | None = None
        self._buffers: list[Tensor] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse ``skip`` next to a gradient scaler, whose step needs the gradients that skip removes."""
        if self.action == "skip" and getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise UserError(
                "NonFiniteLossCallback action: skip does not work with a gradient scaler (precision 16-mixed), "
                "which already skips steps whose gradients overflow; use action: stop"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Before a step's first micro-batch, remember the buffers that a skipped step must restore."""
        if self.action == "skip" and self._loss is None:
            self._buffers = [b.detach().clone() for b in pl_module.buffers()]

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        """Keep this micro-batch's loss (a non-finite one sticks until the optimizer step)."""
        loss = loss.detach().float()
        self._loss = loss if self._loss is None else torch.where(torch.isfinite(self._loss), loss, self._loss)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """If the (all-reduced) gradients are not finite, stop or drop the update on all ranks alike."""
        if self.check_every_n_steps > 1:
            self._keep(trainer)
            return
        if self._loss is None:
            return
        loss, self._loss = self._loss, None
        if trainer.world_size == 1:
            if math.isfinite(loss.item()):  # one process decides alone: the loss is enough
                return
        else:
            # Under DDP the all-reduced gradients decide: a rank-local loss check could let ranks disagree.
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            # FSDP: each rank holds a shard of the gradients; one all-reduced verdict.
            sharded = row_of(trainer.strategy).grads_are_dtensors
            if sharded_finite(grads) if sharded else all_finite(grads):
                return
        losses = gather_ranks(trainer, loss.detach()).reshape(-1).cpu()
        bad = [rank for rank, value in enumerate(losses.tolist()) if not math.isfinite(value)]
        if not bad:
            bad = list(range(trainer.world_size))  # finite losses, overflowing gradients: no single culprit
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        ranks = ", ".join(f"rank {r}: {losses[r].item()}" for r in bad)
        if self.action == "stop":
            checkpoint = _latest_checkpoint(trainer)
            kept = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was written yet"
            raise NonFiniteLossError(
                f"the training loss is not finite at {where} ({ranks}); stopped before applying that update, "
                f"{kept}. Lower the learning rate, clip gradients (trainer.gradient_clip_val) or check the data; "
                "or skip such steps with NonFiniteLossCallback action: skip"
            )
        # Parameters without a gradient are left alone by every torch optimizer: the update is dropped.
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None
        if self._buffers is not None:
            with torch.no_grad():
                for buffer, saved in zip(pl_module.buffers(), self._buffers):
                    buffer.copy_(saved)
        self.skipped += 1
        if trainer.is_global_zero:
            log.warning("skipped the update of %s: the training loss is not finite (%s)", where, ranks)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log how many steps were skipped so far (once per epoch, whatever the logging interval)."""
        if self.action == "skip":
            pl_module.log("train/skipped_steps", float(self.skipped), on_step=False, on_epoch=True, reduce_fx="max")

    # ------------------------------------------------------------ check_every_n_steps > 1
    def _keep(self, trainer: L.Trainer) -> None:
        """Add this step's loss to the window (no sync); check the window when it is full."""
        if self._loss is None:
            return
        entry, self._loss = (trainer.global_step, trainer.current_epoch, self._loss), None
        when = f"at the check before the update of step {trainer.global_step}"
        if trainer.world_size == 1:  # the losses decide, this step's included: its update can still be stopped
            self._window.append(entry)
            if len(self._window) >= self.check_every_n_steps:
                self._check_window(trainer, when)
            return
        # Several processes: the weights decide, and they hold the window's updates but not yet this step's.
        if len(self._window) >= self.check_every_n_steps:
            self._check_window(trainer, when)
        self._window.append(entry)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """No checkpoint holds a non-finite update: compare the windows first (every rank dumps every checkpoint)."""
        if self.check_every_n_steps > 1:
            self._check_window(trainer, f"before the checkpoint of step {trainer.global_step} was written")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last steps of the run are checked too."""
        if self.check_every_n_steps > 1:
            self._check_window(trainer, "at the end of training")

    def _check_window(self, trainer: L.Trainer, when: str) -> None:
        """Stop at the first bad step of the window, on every rank alike; a collective only when one is bad."""
        if not self._window:
            return
        window, self._window = self._window, []
        if trainer.world_size == 1:
            if math.isfinite(torch.stack([loss for _, _, loss in window]).sum().item()):  # 1 us; isfinite: 20
                return
        elif weights_finite(trainer):  # the same on every rank: no collective
            return
        # Every rank got here alike: one all-gather of the windows names the step and the rank(s).
        losses = gather_ranks(trainer, torch.stack([loss for _, _, loss in window])).cpu()
        finite = torch.isfinite(losses)
        checkpoint = _latest_checkpoint(trainer)
        kept = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was written yet"
        advice = "Lower the learning rate, clip gradients (trainer.gradient_clip_val) or check the data"
        if bool(finite.all()):
            if trainer.world_size == 1:
                return  # finite losses whose sum overflowed
            raise NonFiniteLossError(
                f"the weights are not finite after step {trainer.global_step - 1} though every training loss since "
                f"step {window[0][0]} was finite (the gradients overflowed); found {when} "
                f"(check_every_n_steps={self.check_every_n_steps}), {kept}. {advice}"
            )
        first = int((~finite).any(dim=0).nonzero()[0])
        step, epoch, _ = window[first]
        bad = [r for r in range(trainer.world_size) if not finite[r, first]]
        ranks = ", ".join(f"rank {r}: {losses[r, first].item()}" for r in bad)
        if step == trainer.global_step:
            applied = "stopped before applying that update"
        else:  # checked every N steps: the updates since were applied, but no save holds them
            last = trainer.global_step - 1
            steps = f"step {step}" if last == step else f"steps {step} to {last}"
            applied = f"found {when} (check_every_n_steps={self.check_every_n_steps}); the updates of {steps} "
            applied += "were applied, never saved"
        raise NonFiniteLossError(
            f"the training loss is not finite at step {step} (epoch {epoch}) ({ranks}); {applied}, {kept}. {advice}"
        )
