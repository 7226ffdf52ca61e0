"""The plan's learning-rate scaling and warmup, applied to whatever optimizers and schedulers the run built.

Scaling multiplies every param group's learning rate, and every scheduler's base rates, once, at
``on_fit_start``: after the optimizers and schedulers exist and before a resumed run restores their
state (which then carries the scaled rates, so nothing is scaled twice). Warmup multiplies the rate of
each of the first ``warmup_steps`` optimizer steps by ``(step + 1) / warmup_steps`` and puts the
scheduled rate back right after the step, so schedulers keep computing from their own values. Both are
in optimizer steps of the global batch, which are the same at any world size. The builder adds it for a ``fit``
whose ``parallel.learning_rate`` asks for either (:func:`learning_rate_callbacks`, the layer's ``callbacks`` hook).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from project.extras.lr.lightning_private import set_last_lr
from project.models.step_logging import log_on_logged_steps
from project.run_state import RunState


class LearningRateCallback(L.Callback):
    """Scale the learning rates by the plan's factor, warm them up, and log ``train/lr`` on logging steps.

    Args:
        state: The run's state, whose plan (resolved with the data batch size) holds the factor.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._scheduled: tuple[torch.optim.Optimizer, list[float]] | None = None
        self._used: float | None = None

    def _settings(self) -> dict[str, Any]:
        plan = self.state.plan
        return plan.records.get("learning_rate", {}) if plan is not None else {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Multiply every learning rate by the plan's factor (before a resumed run restores its own)."""
        factor = self._settings().get("factor") or 1.0
        if factor == 1.0:
            return
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= factor
                if "initial_lr" in group:  # what a scheduler built on this optimizer starts from
                    group["initial_lr"] *= factor
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            scheduler.base_lrs = [lr * factor for lr in getattr(scheduler, "base_lrs", [])]
            set_last_lr(scheduler)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """During warmup, this step runs at ``(step + 1) / warmup_steps`` of the scheduled rate."""
        warmup = self._settings().get("warmup_steps") or 0
        groups = optimizer.param_groups
        self._used = float(groups[0]["lr"])
        if trainer.global_step >= warmup:
            return
        fraction = (trainer.global_step + 1) / warmup
        self._scheduled = (optimizer, [group["lr"] for group in groups])
        for group in groups:
            group["lr"] *= fraction
        self._used = float(groups[0]["lr"])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Put the scheduled rates back; log the rate this step used on the steps the logger writes."""
        if self._scheduled is not None:
            optimizer, scheduled = self._scheduled
            for group, lr in zip(optimizer.param_groups, scheduled):
                group["lr"] = lr
            self._scheduled = None
        log_on_logged_steps(pl_module, "train/lr", self._used)


def learning_rate_callbacks(state: RunState, row: Any, config: Any) -> list[L.Callback]:
    """The layer's ``callbacks`` hook: :class:`LearningRateCallback` for a training run that scales or warms up.

    Only a command that trains the configured run (``fit``) changes its rates; a self-test (``check``) keeps them.
    """
    section = state.section
    if section is None or state.built is None or not row.trains or not section.learning_rate.active:
        return []
    return [LearningRateCallback(state)]
