"""The Lightning side of the record: a callback that stamps every optimizer step.

Added to plain Lightning by ``bench/plain.py`` and to the template on its command line
(``--trainer.callbacks+=bench.timing.StepTimer``), so both pay the same for being measured.
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch

from bench.record import WARMUP_ENV, StepClock, weights_checksum, write_record


class StepTimer(L.Callback):
    """Stamp the end of every optimizer step; rank 0 writes the record when training ends.

    Args:
        warmup: Steps excluded from the throughput; ``None`` reads ``$BENCH_WARMUP`` (default 0).
    """

    def __init__(self, warmup: int | None = None) -> None:
        self.warmup = int(os.environ.get(WARMUP_ENV, 0)) if warmup is None else warmup
        self.clock: StepClock | None = None
        self.loss: torch.Tensor | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start a clock for this fit (synchronising CUDA at the window's edges on a GPU)."""
        on_gpu = trainer.strategy.root_device.type == "cuda"
        self.clock = StepClock(self.warmup, trainer.max_steps, torch.cuda.synchronize if on_gpu else None)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stamp the step that just ended and keep its loss."""
        assert self.clock is not None
        self.clock.tick()
        self.loss = outputs["loss"] if isinstance(outputs, dict) else outputs

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 writes steps/s, first-step time, final loss and weights checksum."""
        if trainer.is_global_zero and self.clock is not None and self.loss is not None:
            record = self.clock.record(float(self.loss), weights_checksum(pl_module), world_size=trainer.world_size)
            write_record(record)
