"""A module with a rank-local buffer, as a raw-DDP port has one: a running input normaliser each rank keeps itself.

Under ``parallel.ddp.broadcast_buffers: false`` each rank's ``mean`` follows its own batches. The module counts the
training steps that found ``mean`` changed since the rank's previous step (by anything but its own update), and
writes ``{rank: {"changed": count, "mean": its statistic}}`` to ``record`` at the end of fit: ``changed`` is 0
everywhere when nothing overwrote a rank's statistic.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F


class RunningNormaliser(L.LightningModule):
    """A linear classifier of the digits on inputs minus their running mean (a rank-local buffer)."""

    def __init__(self, record: str, in_features: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Linear(in_features, num_classes)
        self.register_buffer("mean", torch.zeros(in_features))
        self.record, self.changed, self._after = record, 0, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x - self.mean)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y), sync_dist=True)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        if self._after is not None and not torch.equal(self.mean, self._after):
            self.changed += 1

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        self._after = self.mean.clone()

    def on_fit_end(self) -> None:
        path = Path(self.record)
        found = json.loads(path.read_text()) if path.exists() else {}
        mine = {"changed": self.changed, "mean": self.mean.tolist()}
        path.write_text(json.dumps({**found, str(self.global_rank): mine}))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
