"""Test-only callback: make one rank late for the first barrier (an injected fault, not synchronisation)."""

from __future__ import annotations

import time

import lightning as L


class LateRank(L.Callback):
    """Rank ``rank`` sleeps ``delay_s`` in ``setup``, before the barrier callback's setup barrier."""

    def __init__(self, rank: int = 1, delay_s: float = 600.0) -> None:
        self.rank = rank
        self.delay_s = delay_s

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.delay_s)
