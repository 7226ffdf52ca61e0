"""Test-only fault injection for real runs of the CLI (``tests/`` is on PYTHONPATH in ``helpers.run_cli``).

Callbacks go in with ``--trainer.callbacks+=faults.KillAtStep``; the model with
``--model.class_path faults.NonFiniteLossAt``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
from torch import Tensor

from project.checkpoints import pending
from project.models.classifier import Batch, Classifier


def _stamp(path: str | None) -> None:
    """Write the wall-clock time of the fault, so a test can measure how long the others took to end."""
    if path:
        Path(path).write_text(f"{time.time()}\n")


class KillAtStep(L.Callback):
    """Kill this process with ``signum`` when rank ``rank`` is about to run optimizer step ``step``.

    Args:
        step: The global step at which to die (mid-epoch when it is not a multiple of the epoch length).
        rank: The global rank that dies; the others carry on until they notice.
        signum: SIGKILL by default: no handler, no cleanup, as a crash or the out-of-memory killer.
        stamp: File that receives the time of the kill.
    """

    def __init__(self, step: int, rank: int = 1, signum: int = int(signal.SIGKILL), stamp: str | None = None) -> None:
        self.step = step
        self.rank = rank
        self.signum = signum
        self.stamp = stamp

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Die at the chosen step on the chosen rank."""
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            # The checkpoint saved a few steps before is complete first: on a loaded machine its background write
            # can outlast those steps, and the test is of a kill between saves (KillDuringSave kills within one).
            pending.wait_for()
            _stamp(self.stamp)
            os.kill(os.getpid(), self.signum)


class StuckAtStep(L.Callback):
    """Make rank ``rank`` wait at step ``step`` for an event that never happens (a hung read, a deadlock).

    The other ranks go on into the next gradient all-reduce and wait there for this one: a stuck
    collective, which only the process group's timeout (``parallel.timeout_s``) can end.
    """

    def __init__(self, step: int, rank: int = 1, stamp: str | None = None) -> None:
        self.step = step
        self.rank = rank
        self.stamp = stamp

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Block forever on an event that nothing sets."""
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            _stamp(self.stamp)
            threading.Event().wait()


class NonFiniteLossAt(Classifier):
    """The digits classifier whose training loss is nan at the given steps (on one rank, or on all).

    Args:
        nan_steps: Global steps whose loss becomes nan.
        nan_rank: The only rank whose loss is nan; ``None``: every rank.
    """

    def __init__(self, *args, nan_steps: list[int] | None = None, nan_rank: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_steps = set(nan_steps or [])
        self.nan_rank = nan_rank

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """The real loss, times nan where asked."""
        loss = super().training_step(batch, batch_idx)
        hit = self.trainer.global_step in self.nan_steps and self.nan_rank in (None, self.trainer.global_rank)
        return loss * float("nan") if hit else loss


class PickledExtra:
    """A custom class: a checkpoint that holds one needs arbitrary code (full pickle) to load."""

    def __init__(self, note: str = "trusted") -> None:
        self.note = note


class SlowRank(L.Callback):
    """Make rank ``rank`` spend ``sleep_s`` more of its own time in every step (a slow host or data loader)."""

    def __init__(self, rank: int = 1, sleep_s: float = 0.03) -> None:
        self.rank = rank
        self.sleep_s = sleep_s

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Sleep before this rank's forward (before its gradient all-reduce, where the others wait for it)."""
        if trainer.global_rank == self.rank:
            time.sleep(self.sleep_s)
