"""Test-only fault for the FSDP tests, added with ``--trainer.callbacks+=...`` (``tests/`` is on PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L

from project.checkpoints import sharded


class KillBeforeShardedRename(L.Callback):
    """SIGKILL global rank 0 when a sharded save of global step ``step`` is complete but not yet under its name.

    Every rank has written its shards, DCP its ``.metadata`` and rank 0 ``meta.pt`` into the hidden folder; the
    one rename that would make it ``last.ckpt`` never happens. (The other rank then loses rank 0 in the barrier.)
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the one function that moves a finished sharded checkpoint onto its name."""
        replace = sharded.replace

        def dying_replace(source: Path, target: Path) -> None:
            if trainer.global_step == self.step and trainer.global_rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            replace(source, target)

        sharded.replace = dying_replace
