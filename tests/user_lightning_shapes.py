"""Plain Lightning code written from scratch, as a new user would (issue 34), not the template's.

- :class:`LazyClassifier`: its layers are built in ``configure_model`` (Lightning's hook for large models).
- :class:`TwoValLoaders`: a datamodule with two validation loaders (metrics named ``<name>/dataloader_idx_<i>``).
- :class:`TwoLoaderClassifier`: logs ``val/mse`` from each validation loader.
- :class:`WritingDigits`: a datamodule whose ``prepare_data`` writes a file (a download), as many do.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader
from user_code import PlainDigits, digits_parts


class LazyClassifier(L.LightningModule):
    """The network is built in ``configure_model``, not in ``__init__`` (meta-device init under FSDP needs it)."""

    def __init__(self, hidden: int = 32, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        """Build the layers once (Lightning calls this hook for every stage)."""
        if self.net is not None:
            return
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, self.hparams.hidden), nn.ReLU(), nn.Linear(self.hparams.hidden, 10)
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits."""
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy."""
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Validation loss."""
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y), sync_dist=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Test accuracy."""
        x, y = batch
        self.log("test/acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Predicted classes."""
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TwoValLoaders(PlainDigits):
    """Two validation loaders (the held-out digits, then the test digits): Lightning names each metric per loader."""

    def val_dataloader(self) -> list[DataLoader]:
        """Two loaders."""
        return [DataLoader(self.val, batch_size=self.bs), DataLoader(self.test, batch_size=self.bs)]


class TwoLoaderRegressor(L.LightningModule):
    """Logs ``val/mse`` from every validation loader (``val/mse/dataloader_idx_0`` and ``_1`` in Lightning's names)."""

    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Mean squared error against the one-hot labels."""
        x, y = batch
        loss = F.mse_loss(self.net(x), F.one_hot(y, 10).float())
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        """The same metric name from each loader."""
        x, y = batch
        self.log("val/mse", F.mse_loss(self.net(x), F.one_hot(y, 10).float()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD."""
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class WritingDigits(PlainDigits):
    """``prepare_data`` writes the data to ``data_dir`` (as a download does); ``setup`` reads it from there."""

    def __init__(self, data_dir: str = "data", bs: int = 16) -> None:
        super().__init__(bs=bs)
        self.data_dir = data_dir
        self.batch_size = bs

    def prepare_data(self) -> None:
        """The "download": the digits written to a file."""
        Path(self.data_dir).mkdir(parents=True, exist_ok=True)
        torch.save(digits_parts(), Path(self.data_dir) / "digits.pt")

    def setup(self, stage: str | None = None) -> None:
        """Read what prepare_data wrote."""
        self.train, self.val, self.test = torch.load(Path(self.data_dir) / "digits.pt", weights_only=False)
