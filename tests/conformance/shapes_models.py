"""Plain-Lightning modules of the conformance lane, one per documented feature, written as users write them.

:class:`PointsRegressor` is the plain module every other one changes in one place. Its evaluation steps record
which samples they evaluated (``seen/<kind>-rank<r>.txt``: ``<step> <dataloader_idx> <index>`` per sample) and
``on_fit_end`` the step training ended at (``seen/final-rank<r>.txt``), so the lane can check each validation
sample was evaluated once and that ``last.ckpt`` holds the end of training (docs/conformance.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

SEEN = Path("seen")


def write_record(kind: str, rank: int, lines: list[str]) -> None:
    """Append ``lines`` to ``seen/<kind>-rank<rank>.txt`` (in the run's working folder)."""
    SEEN.mkdir(exist_ok=True)
    with (SEEN / f"{kind}-rank{rank}.txt").open("a") as handle:
        handle.write("".join(line + "\n" for line in lines))


class PointsRegressor(L.LightningModule):
    """8 -> 16 -> 1 with tanh, mean squared error, plain SGD: the module a user starts from."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net: nn.Module | None = self.build()

    def build(self) -> nn.Module:
        """The network (built in ``__init__`` here; :class:`ConfigureModel` builds it in ``configure_model``)."""
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: Tensor) -> Tensor:
        """The prediction."""
        return self.net(x)

    def loss(self, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Mean squared error of one ``(index, x, y)`` batch."""
        _, x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        """The loss."""
        return self.loss(batch)

    def record(self, kind: str, batch: Any, dataloader_idx: int) -> None:
        """Which samples this rank evaluated or predicted (not in the sanity check, which is not an evaluation)."""
        if not self.trainer.sanity_checking:
            lines = [f"{self.trainer.global_step} {dataloader_idx} {int(i)}" for i in batch[0]]
            write_record(kind, self.global_rank, lines)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """``val/loss``, averaged over the ranks."""
        self.record("val", batch, dataloader_idx)
        self.log("val/loss", self.loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """``test/loss``."""
        self.record("test", batch, dataloader_idx)
        self.log("test/loss", self.loss(batch), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """The predictions."""
        self.record("predict", batch, dataloader_idx)
        return self(batch[1])

    def on_fit_end(self) -> None:
        """The step training ended at."""
        write_record("final", self.global_rank, [str(self.trainer.global_step)])

    def configure_optimizers(self) -> Any:
        """Plain SGD."""
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class ConfigureModel(PointsRegressor):
    """The network built in ``configure_model`` (Lightning's hook for sharded or large models)."""

    def build(self) -> None:
        """Nothing in ``__init__``."""
        return None

    def configure_model(self) -> None:
        """Built here, once."""
        if self.net is None:
            self.net = super().build()


class CheckpointHooks(PointsRegressor):
    """Its own counter kept in the checkpoint by ``on_save_checkpoint`` / ``on_load_checkpoint``."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr)
        self.batches_trained = 0

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Counted."""
        self.batches_trained += 1
        return self.loss(batch)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The counter in the checkpoint."""
        checkpoint["user_batches_trained"] = self.batches_trained

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """And back."""
        self.batches_trained = checkpoint["user_batches_trained"]


class ManualTwoOptimizers(PointsRegressor):
    """Manual optimization: SGD for the first layer, Adam for the second, each stepped by hand."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Both optimizers on one loss."""
        first, second = self.optimizers()
        loss = self.loss(batch)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        return loss.detach()

    def configure_optimizers(self) -> Any:
        """Two optimizers."""
        return torch.optim.SGD(self.net[0].parameters(), lr=self.lr), torch.optim.Adam(self.net[2].parameters(), 0.01)


class StepLRByStep(PointsRegressor):
    """``StepLR`` stepped every optimizer step."""

    def configure_optimizers(self) -> Any:
        """Halved every 3 steps."""
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StepLRByEpoch(PointsRegressor):
    """``StepLR`` stepped every epoch (Lightning's default interval)."""

    def configure_optimizers(self) -> Any:
        """Halved every epoch."""
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class Plateau(PointsRegressor):
    """``ReduceLROnPlateau`` on ``val/loss``."""

    def configure_optimizers(self) -> Any:
        """Reduced when validation stops improving."""
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=10.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss"}}


class Finetuned(PointsRegressor):
    """A ``backbone`` and a ``head``, as ``BackboneFinetuning`` wants; the optimizer takes what is trainable."""

    def build(self) -> nn.Module:
        """Backbone and head."""
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)
        return nn.Sequential(self.backbone, self.head)

    def configure_optimizers(self) -> Any:
        """Lightning's documented form: only the parameters that require a gradient."""
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class CombinedBatches(PointsRegressor):
    """Training on a ``CombinedLoader``'s dict batch: the mean of both halves' losses."""

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        """Both loaders' batches."""
        return (self.loss(batch["a"]) + self.loss(batch["b"])) / 2
