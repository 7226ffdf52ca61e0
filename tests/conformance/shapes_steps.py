"""Plain-Lightning modules of the conformance lane that change what a step or an evaluation does: metrics, gathers,
callbacks from the module, a skipped step, an epoch ended early, a stop of the module's own.

Each is :class:`conformance.shapes_models.PointsRegressor` changed in one place, as users write it.
"""

from __future__ import annotations

from typing import Any

import torch
import torchmetrics
from conformance.shapes_models import PointsRegressor, write_record
from lightning.pytorch.callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from torch import Tensor, nn


class Metrics(PointsRegressor):
    """A torchmetrics ``MeanSquaredError`` logged as a metric object, synchronised by torchmetrics."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr)
        self.val_mse = torchmetrics.MeanSquaredError()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """The metric updated and logged."""
        super().validation_step(batch, batch_idx, dataloader_idx)
        self.val_mse(self(batch[1]), batch[2])
        self.log("val/mse", self.val_mse, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        """The whole set's value, as this rank sees it."""
        if not self.trainer.sanity_checking:
            write_record(
                "metric", self.global_rank, [f"{self.trainer.global_step} {float(self.val_mse.compute()):.8f}"]
            )


class Gathered(PointsRegressor):
    """The whole validation set's error from ``self.all_gather`` of each rank's sum and count."""

    def on_validation_epoch_start(self) -> None:
        """A fresh sum."""
        self.sums = torch.zeros(2)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Summed."""
        super().validation_step(batch, batch_idx, dataloader_idx)
        error = (self(batch[1]) - batch[2]).pow(2).sum()
        self.sums = self.sums + torch.stack([error.detach(), torch.tensor(float(len(batch[0])))])

    def on_validation_epoch_end(self) -> None:
        """All ranks' sums gathered: every rank knows the whole set's mean."""
        gathered = self.all_gather(self.sums).reshape(-1, 2).sum(0)
        if not self.trainer.sanity_checking:
            write_record(
                "metric", self.global_rank, [f"{self.trainer.global_step} {float(gathered[0] / gathered[1]):.8f}"]
            )


class OwnCallbacks(PointsRegressor):
    """Callbacks from ``configure_callbacks``: its own ModelCheckpoint and a LearningRateMonitor."""

    def configure_callbacks(self) -> list[Callback]:
        """As users write it."""
        best = ModelCheckpoint(monitor="val/loss", filename="own-{step}", save_top_k=1)
        return [best, LearningRateMonitor(), EarlyStopping(monitor="val/loss", patience=5)]


class SkipsSteps(PointsRegressor):
    """``training_step`` returns None (no backward, no step) on the third batch of each epoch."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        """Skip batch 2."""
        return None if batch_idx == 2 else self.loss(batch)


class EndsEpochEarly(PointsRegressor):
    """``on_train_batch_start`` returns -1 at batch 4 of the first epoch: the rest of that epoch is skipped."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """-1 ends the epoch."""
        return -1 if self.current_epoch == 0 and batch_idx == 4 else None


class StopsItself(PointsRegressor):
    """Sets ``trainer.should_stop`` after optimizer step 11."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Stop."""
        if self.trainer.global_step == 11:
            self.trainer.should_stop = True


class TiedWeights(PointsRegressor):
    """Two layers sharing one weight (``self.net[2].weight = self.net[0].weight``), as tied embeddings are."""

    def build(self) -> nn.Module:
        """8 -> 8 -> 8 -> 1, the two 8 x 8 layers one weight."""
        net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
        net[2].weight = net[0].weight
        return net


class RunningNormaliser(PointsRegressor):
    """Inputs minus a running mean each rank keeps itself (a buffer, rank-local under ``broadcast_buffers: false``)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr)
        self.register_buffer("mean", torch.zeros(8))

    def forward(self, x: Tensor) -> Tensor:
        """The prediction of the normalised input."""
        return self.net(x - self.mean)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The loss; the running mean follows this rank's samples."""
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * batch[1].mean(0))
        return self.loss(batch)
