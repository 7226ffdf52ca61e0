"""LightningModules as most Lightning code writes them: the network built in ``__init__``, no class path to it.

Plugged in by class path (``tests/`` is on PYTHONPATH for CLI runs):

- :class:`SequentialClassifier`: ``self.net = nn.Sequential(...)`` (with BatchNorm and Dropout, which an export
  must capture in eval mode).
- :class:`GatedClassifier`: a custom network whose ``forward`` branches on the data, which a graph capture
  (torch.export) cannot follow.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn


class SequentialClassifier(L.LightningModule):
    """Digits classifier around ``self.net = nn.Sequential(...)`` built here, logging ``val/acc`` and ``val/loss``."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = self.build(hidden)

    def build(self, hidden: int) -> nn.Module:
        """The network."""
        return nn.Sequential(
            nn.Linear(64, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 10)
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits."""
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy."""
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        x, y = batch
        logits = self.net(x)
        self.log(f"{stage}/loss", nn.functional.cross_entropy(logits, y), on_epoch=True, sync_dist=True)
        self.log(f"{stage}/acc", (logits.argmax(1) == y).float().mean(), on_epoch=True, sync_dist=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """``val/loss`` and ``val/acc``."""
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """``test/loss`` and ``test/acc``."""
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam (a config's ``optimizer:`` section replaces it)."""
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class GatedNet(nn.Module):
    """A custom network without ``init_args`` whose ``forward`` takes a branch chosen by the data."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = nn.Linear(64, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        """Logits; whether the hidden layer's mean exceeds 0.5 picks the branch (data-dependent control flow)."""
        h = torch.relu(self.body(x))
        if h.mean() > 0.5:
            h = h / 2
        return self.head(h)


class GatedClassifier(SequentialClassifier):
    """:class:`SequentialClassifier` around a :class:`GatedNet`, which torch.export cannot capture."""

    def build(self, hidden: int) -> nn.Module:
        """The network."""
        return GatedNet(hidden)


class TwoLayerNet(nn.Module):
    """Two Linear layers called in ``forward`` (no ``nn.Sequential``): ``auto`` cannot tell they pair up."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = nn.Linear(64, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        """Logits."""
        return self.head(torch.relu(self.body(x)))


class PatternClassifier(SequentialClassifier):
    """A network a plan of name patterns splits (``net.body`` colwise, ``net.head`` rowwise)."""

    def build(self, hidden: int) -> nn.Module:
        """The network."""
        return TwoLayerNet(hidden)


class SplitsItself(SequentialClassifier):
    """A module that splits its own network when handed the tensor-parallel mesh (``parallelize(mesh)``)."""

    def build(self, hidden: int) -> nn.Module:
        """The network."""
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def parallelize(self, mesh) -> None:
        """Column-split the first Linear and row-split the second over ``mesh``."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(self.net, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
