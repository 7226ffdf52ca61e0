"""Refuse, before training, a monitored metric that validation never logs (it would fail after a whole epoch).

The sanity check shows what validation logs (``train...`` monitors are left to Lightning). With several loaders,
``<name>/dataloader_idx_<i>`` exists only from the first real validation on: the sanity check's record proves it.
Without a sanity check (``num_sanity_val_steps: 0``) the first validation is checked, after saving what trained.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden

from project.callbacks.timed_checkpoint import TimedCheckpoint
from project.errors import UserError
from project.lightning_private import logged_per_loader


def monitored(trainer: L.Trainer) -> list[tuple[str, str]]:
    """(callback name, metric) of every checkpoint and early-stopping callback that monitors a metric."""
    kinds = (ModelCheckpoint, EarlyStopping)
    watching = [c for c in trainer.callbacks if isinstance(c, kinds) and getattr(c, "monitor", None)]
    return [(type(c).__name__, str(c.monitor)) for c in watching]


def validates(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether this fit has validation to run: a ``validation_step``, a validation loader, batches not limited to 0."""
    source = trainer.datamodule if trainer.datamodule is not None else pl_module
    overridden = is_overridden("validation_step", pl_module) and is_overridden("val_dataloader", source)
    return overridden and trainer.limit_val_batches != 0


def logged_in_validation(trainer: L.Trainer) -> list[str]:
    """The metric names validation logged in the sanity check, per-loader names (Lightning's) included."""
    names = set(trainer.callback_metrics)
    per_loader = logged_per_loader(trainer)
    if len(set().union(*per_loader.values())) > 1:  # one loader: Lightning adds no suffix
        names |= {f"{name}/dataloader_idx_{index}" for name, indices in per_loader.items() for index in indices}
    return sorted(names)


class MonitoredMetricsCheck(L.Callback):
    """Refuse, after the sanity check, a monitored metric validation never logs; note a fit that never validated."""

    validated = False  # a real validation ran in this fit
    checked = False  # the monitors were compared with what validation logs

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Run first at each validation end: an EarlyStopping listed before would fail on the metric first."""
        trainer.callbacks.remove(self)
        trainer.callbacks.insert(0, self)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Count this fit's validations from here (the sanity check is not one)."""
        self.validated = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A real validation ran; the first one is checked when no sanity check was (the trained state saved first)."""
        if trainer.sanity_checking or trainer.state.fn != "fit":  # `validate` monitors nothing
            return
        self.validated = True
        if not self.checked and _unlogged(trainer, pl_module) is not None:
            saver = next((c for c in trainer.callbacks if isinstance(c, TimedCheckpoint)), None)
            saved = f"; the trained state is saved in {saver.save_now(trainer)}" if saver is not None else ""
            raise UserError(f"{_unlogged(trainer, pl_module)} (num_sanity_val_steps=0 checked it only now){saved}")
        self.checked = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """One line (rank 0) when the module validates but this fit ended before its first validation."""
        if self.validated or not trainer.is_global_zero or not validates(trainer, pl_module):
            return
        watching = ", ".join(f"{name}(monitor={metric!r})" for name, metric in monitored(trainer))
        print(
            f"note: validation never ran in this fit: it ended at step {trainer.global_step}, before the first "
            f"validation (val_check_interval={trainer.val_check_interval}, check_val_every_n_epoch="
            f"{trainer.check_val_every_n_epoch}); no validation metric was logged"
            + (f" and {watching} chose nothing" if watching else "")
            + "; validate sooner with a smaller --trainer.val_check_interval",
            flush=True,
        )

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Compare the monitors with what the validation pass logged."""
        self.checked = True
        if (problem := _unlogged(trainer, pl_module)) is not None:
            raise UserError(problem)


def _unlogged(trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
    """The first monitor that the validation just run did not log, said with what it did log; else ``None``."""
    logged = logged_in_validation(trainer)
    for name, metric in monitored(trainer):
        if metric in logged or metric.startswith("train"):
            continue
        shown = ", ".join(logged) if logged else "nothing"
        return (
            f"{name}(monitor={metric!r}): {type(pl_module).__name__} never logs {metric!r} in validation "
            f"(it logs {shown}); monitor one of those in the config's callbacks, or log {metric!r} in "
            "validation_step"
        )
    return None
