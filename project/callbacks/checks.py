"""Checks that need the user's module to run once: every monitored metric is really logged.

A ``ModelCheckpoint(monitor="val/acc")`` or ``EarlyStopping`` whose metric the module never logs fails only
when it first saves, after a whole epoch, with a traceback. The sanity check (Lightning's validation pass
before training) shows which metrics validation logs, so the mistake is one line before training instead.
Monitors whose name starts with ``train`` are metrics of the training steps, which the sanity check cannot
see; they are left to Lightning.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from project.errors import UserError


def monitored(trainer: L.Trainer) -> list[tuple[str, str]]:
    """(callback name, metric) of every checkpoint and early-stopping callback that monitors a metric."""
    found = []
    for callback in trainer.callbacks:
        if isinstance(callback, (ModelCheckpoint, EarlyStopping)) and getattr(callback, "monitor", None):
            found.append((type(callback).__name__, str(callback.monitor)))
    return found


class MonitoredMetricsCheck(L.Callback):
    """Refuse, after the sanity check and before training, a monitored metric that validation never logs."""

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Compare the monitors with what the validation pass logged."""
        logged = sorted(trainer.callback_metrics)
        for name, metric in monitored(trainer):
            if metric in logged or metric.startswith("train"):
                continue
            shown = ", ".join(logged) if logged else "nothing"
            raise UserError(
                f"{name}(monitor={metric!r}): {type(pl_module).__name__} never logs {metric!r} in validation "
                f"(it logs {shown}); monitor one of those in the config's callbacks, or log {metric!r} in "
                "validation_step"
            )
