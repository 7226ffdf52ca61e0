"""Test-only faults for the resume tests, added with ``--trainer.callbacks+=...`` (``tests/`` is on PYTHONPATH).

- :class:`KillOnceAtStep`: a worker that dies once, so that a restarted job (torchrun --max-restarts) goes on.
- :class:`KillDuringSave`: a process killed in the middle of writing a checkpoint.
- :class:`SlowStampedSteps`: steps of a known minimum length, each one's end time written down (time-based saves).
"""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path
from typing import IO, Any

import lightning as L
import torch

from project.checkpoints.io import AtomicCheckpointIO

from faults import KillAtStep


class KillOnceAtStep(KillAtStep):
    """:class:`KillAtStep` that leaves ``marker`` behind and never kills again while it exists."""

    def __init__(self, step: int, marker: str, rank: int = 1) -> None:
        super().__init__(step, rank)
        self.marker = Path(marker)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Die at the chosen step on the chosen rank, the first time only."""
        if trainer.global_step == self.step and trainer.global_rank == self.rank and not self.marker.exists():
            self.marker.touch()
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


class KillDuringSave(L.Callback):
    """SIGKILL this process half-way through writing the checkpoint of global step ``step``.

    It hooks the CheckpointIO the CLI installed (and fails if that is not the atomic one), writes half
    of the serialised checkpoint into the file being written, syncs it to disk and dies.
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the installed CheckpointIO's write."""
        installed = trainer.strategy.checkpoint_io
        if not isinstance(installed, AtomicCheckpointIO):
            raise RuntimeError(f"the CLI installed {type(installed).__name__}, not AtomicCheckpointIO")
        write = installed.write

        def dying_write(checkpoint: dict[str, Any], handle: IO[bytes]) -> None:
            if checkpoint.get("global_step") != self.step:
                write(checkpoint, handle)
                return
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            handle.write(buffer.getvalue()[: buffer.tell() // 2])
            handle.flush()
            os.fsync(handle.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        installed.write = dying_write


class SlowStampedSteps(L.Callback):
    """Make every optimizer step last at least ``sleep_s`` longer; rank 0 appends ``<step> <time.time()>`` per step.

    So a run's steps have a known pace and a test can tell how much work a resumed checkpoint lost.
    """

    def __init__(self, sleep_s: float, stamps: str) -> None:
        self.sleep_s = sleep_s
        self.stamps = Path(stamps)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        """Sleep, then stamp the step that just ended (checkpoint callbacks run after this one)."""
        time.sleep(self.sleep_s)
        if trainer.is_global_zero:
            with self.stamps.open("a") as handle:
                handle.write(f"{trainer.global_step} {time.time()}\n")
