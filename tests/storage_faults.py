"""Faults for the object-storage tests: a process killed in the middle of an upload (test-only callbacks)."""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L
import torch


class KillDuringUpload(L.Callback):
    """SIGKILL this process once the data of a checkpoint of step ``step`` or later is in the store.

    The kill comes after the data's PUT and before the commit object's: what a crash, a preemption without grace
    or a lost node leaves in the middle of an upload (for a sharded folder: after some of its files).
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the storage layer's upload of one file (the writer thread calls it)."""
        from project.storage import objects

        original = objects.put

        def dying_put(fs: Any, local: Any, remote: str) -> dict[str, Any]:
            entry = original(fs, local, remote)
            if "/checkpoints/.data/" in remote and torch.load(local, weights_only=True)["global_step"] >= self.step:
                os.kill(os.getpid(), signal.SIGKILL)  # training may be steps ahead: the file says which save
            return entry

        objects.put = dying_put
