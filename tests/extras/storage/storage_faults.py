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
        from project.extras.storage import objects

        original = objects.put

        def dying_put(fs: Any, local: Any, remote: str) -> dict[str, Any]:
            entry = original(fs, local, remote)
            if "/checkpoints/.data/" in remote and torch.load(local, weights_only=True)["global_step"] >= self.step:
                os.kill(os.getpid(), signal.SIGKILL)  # training may be steps ahead: the file says which save
            return entry

        objects.put = dying_put


class KillAfterOwnShards(L.Callback):
    """SIGKILL rank ``rank`` once its own shards of the first sharded save of step ``step`` or later are in the store.

    The other ranks' shards may be up too; rank 0's commit is not (it waits for every rank's upload first): a kill
    after some shards of a sharded checkpoint and before its commit.
    """

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step = step
        self.rank = rank
        self.steps: dict[str, int] = {}  # save token -> the step it saved

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Note each save's step by its token (training thread); kill after the upload (writer thread)."""
        from project.extras.sharding.checkpoints import save as sharded_save
        from project.extras.storage import shards

        partial_name, upload_own = sharded_save.partial_name, shards.upload_own

        def noting(target: Any, token: str) -> Any:
            self.steps[token] = trainer.global_step
            return partial_name(target, token)

        def dying(partial: Any, path: Any, token: str, rank: int) -> dict[str, Any]:
            files = upload_own(partial, path, token, rank)
            if rank == self.rank and self.steps.get(token, -1) >= self.step:
                os.kill(os.getpid(), signal.SIGKILL)
            return files

        sharded_save.partial_name, shards.upload_own = noting, dying
