"""The callback that keeps each rank's loop phase and runs its hang watcher while a multi-process run lasts."""

from __future__ import annotations

import atexit
import uuid
from pathlib import Path
from typing import Any

import lightning as L

from project.extras.resilience.hang.records import PHASE
from project.extras.resilience.hang.watch import HangWatch
from project.extras.resilience.lightning_private import process_group_timeout_s
from project.launch.ranks import explain_failures_with
from project.lightning_private import launched_processes
from project.parallel.collectives import in_process_group
from project.runs import run_directory

#: The stall threshold as a share of the process group's timeout: the records are taken while every rank is
#: still there to give one (the timeout then ends the run as before).
STALL_SHARE = 0.5
#: The process group's timeout when the strategy does not say (torch's default for gloo).
DEFAULT_TIMEOUT_S = 1800.0

_WATCH: HangWatch | None = None


def current_watch() -> HangWatch | None:
    """This process's watcher while a multi-process run lasts (``None`` on one process, or none running)."""
    return _WATCH


class HangRecorder(L.Callback):
    """On several processes: notes the loop phase at each hook (two attribute writes) and watches for a stall.

    Args:
        folder: Where ``hang/`` goes; ``None``: the run directory.
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = folder

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Start this rank's watcher (a token and the folder from rank 0: one broadcast at setup, none per step)."""
        global _WATCH
        if trainer.world_size < 2 or not in_process_group() or _WATCH is not None:
            return
        folder = self.folder if self.folder is not None else run_directory(trainer)
        token, folder = trainer.strategy.broadcast((uuid.uuid4().hex, str(folder or ".")), src=0)
        timeout_s = process_group_timeout_s(trainer.strategy) or DEFAULT_TIMEOUT_S
        strategy = trainer.strategy

        def ranks_it_started() -> set[int]:  # children that are ranks, not DataLoader workers
            return {process.pid for process in launched_processes(strategy)}

        stall_s = timeout_s * STALL_SHARE
        _WATCH = HangWatch(token, trainer.global_rank, trainer.world_size, Path(folder), stall_s, ranks_it_started)
        explain_failures_with(_launcher_note)
        atexit.register(_close)
        PHASE.name, PHASE.step = f"{stage} setup", trainer.global_step

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The run is over: end the watcher."""
        _close()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """In a training step (forward, backward and the gradient all-reduce, the optimizer step)."""
        PHASE.name, PHASE.step = "training step", trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Between steps: the next batch is being loaded (or epoch-end work)."""
        PHASE.name = "data loading (training)"

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Validation (its steps, data loading and epoch-end hooks)."""
        PHASE.name = "validation"

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        """After validation's epoch-end hooks: its metrics are reduced, checkpoints are saved."""
        PHASE.name = "validation end (metrics, checkpoints)"

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """A checkpoint is being saved."""
        PHASE.name = "checkpoint save"

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        """The training epoch's end hooks (checkpoints, schedulers)."""
        PHASE.name = "training epoch end"

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Testing."""
        PHASE.name = "test"

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Predicting."""
        PHASE.name = "predict"


def _close() -> None:
    global _WATCH
    watch, _WATCH = _WATCH, None
    if watch is not None:
        watch.close()


def _launcher_note() -> str | None:
    """For rank 0's launcher: the verdict, once rank 0's watcher wrote the summary (it names the stuck rank)."""
    watch = _WATCH
    line = watch.summary(ask=False) if watch is not None else None  # no store request from this thread
    return f"{line}. Every rank's stacks and last collectives: {watch.folder / 'hang'}" if line is not None else None
