"""``last.ckpt`` every ``every_s`` seconds of training, at every epoch end and at the final step (docs/checkpoints.md).

A crash costs time, not steps. A save is collective but each rank has its own clock: rather than Lightning's
broadcast after every step, the ranks agree in advance on the step of the next check (:class:`SaveSchedule`). An
epoch end is saved after the next epoch's first optimizer step: in ``on_train_epoch_end`` Lightning 2.6 has not
counted the epoch completed nor stepped its schedulers, and a resume from there would skip an epoch's steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any
from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from project.lightning_private import state_key

#: Checks per interval under DDP: how late a save may come when the step rate changes, as a share of ``every_s``.
CHECKS_PER_INTERVAL = 10


class SaveSchedule:
    """Rank 0's clock (``clock``: monotonic seconds, a fake in tests): whether a save is due, and the next check."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.start(0)

    def start(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: count from now."""
        self.last_save = self.check_time = self.clock()
        self.check_step = step

    def saved(self) -> None:
        """A checkpoint was saved now."""
        self.last_save = self.clock()

    def due(self) -> bool:
        """Whether ``every_s`` have passed since the last save (one process asks after every step)."""
        return self.clock() - self.last_save >= self.every_s

    def check(self, step: int) -> tuple[bool, int]:
        """At a check after step ``step``: (save now, next check's step: ``every_s / 10`` later at the step rate)."""
        now = self.clock()
        save = now - self.last_save >= self.every_s
        remaining = self.every_s if save else self.every_s - (now - self.last_save)
        per_step = (now - self.check_time) / max(1, step - self.check_step)
        self.check_time, self.check_step = now, step
        gap_s = min(remaining, self.every_s / CHECKS_PER_INTERVAL)
        return save, step + (max(1, math.ceil(gap_s / per_step)) if per_step > 0 else 1)


class TimedCheckpoint(ModelCheckpoint):
    """A ``ModelCheckpoint`` of the latest weights: every ``every_s`` seconds, every epoch, at the final step.

    Args:
        every_s: Seconds of training (wall clock, validation included) between saves; ``None``: not by time.
            A run killed at any moment loses at most about this much work (docs/checkpoints.md).
        every_n_steps: Also save every N optimizer steps (deterministic, for tests and reproducible
            layouts); ``None``: not by steps.
        every_n_epochs: Save at the end of every N-th epoch (after its validation); 0: not at epoch ends.
        dirpath: Folder of the file; ``None``: the run directory's ``checkpoints/`` (as ``ModelCheckpoint``).
        filename: File name without ``.ckpt``; each save replaces it.
        save_weights_only: Save only the weights (such a file cannot resume a run).
    """

    def __init__(
        self,
        every_s: float | None = 60.0,
        every_n_steps: int | None = None,
        every_n_epochs: int = 1,
        dirpath: str | None = None,
        filename: str = "last",
        save_weights_only: bool = False,
    ) -> None:
        if every_s is not None and not every_s > 0:
            raise ValueError(f"TimedCheckpoint every_s={every_s} must be > 0 seconds (or null: not by time)")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"TimedCheckpoint every_n_steps={every_n_steps} must be >= 1 (or null: not by steps)")
        if every_n_epochs < 0:
            raise ValueError(f"TimedCheckpoint every_n_epochs={every_n_epochs} must be >= 0 (0: not at epoch ends)")
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=None,
            save_top_k=1,
            save_weights_only=save_weights_only,
            every_n_epochs=every_n_epochs,
            enable_version_counter=False,  # the same file every time, never last-v1.ckpt
        )
        self.every_s, self.every_n_steps = every_s, every_n_steps
        self.schedule = SaveSchedule(every_s) if every_s is not None else None
        self._seen_step, self._start_step, self._next_check = -1, 0, 0
        self._active, self._one_process = True, True  # at on_train_start: not fast_dev_run (as ModelCheckpoint), 1 rank
        self._epoch_end_due = False  # an epoch ended whose save waits for the next epoch's first step
        # Built once, from the file alone: changing the interval keeps the state.
        self._state_key = state_key(self, filename=filename)

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint (built once)."""
        return self._state_key

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock; the first check under DDP is after the first step (it measures the step rate)."""
        super().on_train_start(trainer, pl_module)
        self._seen_step = self._start_step = trainer.global_step
        self._next_check = trainer.global_step + 1
        # Read once: these Trainer properties walk several objects, and this hook runs every step.
        self._active, self._one_process = not trainer.fast_dev_run, trainer.world_size == 1
        if self.schedule is not None:
            self.schedule.start(trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """An epoch that ends is saved after the next epoch's first step (or at the end of fit): see the module doc."""
        self._note_epoch_end(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Nothing is saved at a validation: an epoch-end one is noted as the epoch's end, the others by the clock."""
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._note_epoch_end(trainer)

    def _note_epoch_end(self, trainer: L.Trainer) -> None:
        every = self.every_n_epochs  # ModelCheckpoint's public property
        if self._active and not trainer.sanity_checking and every >= 1 and (trainer.current_epoch + 1) % every == 0:
            self._epoch_end_due = True

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Any checkpoint (this one, an epoch end, the best) restarts the count: a restart could resume from it."""
        if self.schedule is not None:
            self.schedule.saved()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After each optimizer step: save when the steps or the clock (agreed by the ranks) say so."""
        step = trainer.global_step
        if step == self._seen_step or not self._active:  # a micro-batch that did not step (accumulation)
            return
        self._seen_step = step
        save = self._epoch_end_due or (self.every_n_steps is not None and step % self.every_n_steps == 0)
        if self.schedule is not None:
            if self._one_process:
                save = save or self.schedule.due()
            elif step >= self._next_check:
                verdict = self.schedule.check(step) if trainer.is_global_zero else None
                due, self._next_check = trainer.strategy.broadcast(verdict, src=0)
                save = save or due
        if save or step == trainer.max_steps:  # the final step of a max_steps run, saved where a resume is exact
            self.save_now(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A fit that ended (max_steps, max_epochs, max_time, early stopping...): its final step saved (every rank)."""
        trained = trainer.global_step > self._start_step  # a resume of a finished run trains (and saves) nothing
        if self._active and trained and self._last_global_step_saved != trainer.global_step:
            self.save_now(trainer)

    def save_now(self, trainer: L.Trainer) -> str:
        """Save the current step now (every rank, at the same step: a save is collective); returns the file."""
        filepath = self.format_checkpoint_name({"epoch": trainer.current_epoch, "step": trainer.global_step})
        # As ModelCheckpoint does: the path is set first, since it is part of the state being saved.
        previous, self.best_model_path = self.best_model_path, filepath
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_global_step_saved, self._epoch_end_due = trainer.global_step, False
        if previous and previous != filepath:
            trainer.strategy.remove_checkpoint(previous)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
        return filepath
