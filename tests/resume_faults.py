"""Test-only faults for the resume tests, added with ``--trainer.callbacks+=...`` (``tests/`` is on PYTHONPATH).

- :class:`KillOnceAtStep`: a worker that dies once, so that a restarted job (torchrun --max-restarts) goes on.
- :class:`KillDuringSave`: a process killed in the middle of writing a checkpoint.
"""

from __future__ import annotations

import io
import os
import signal
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
