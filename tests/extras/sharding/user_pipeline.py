"""Users' LightningModules for pipeline parallelism, not the template's GPT, on random regression data (no download).

``SequentialRegressor``: an ``nn.Sequential`` of Linear layers that names its own stage boundaries, its own
training_step and loss. ``BlockListRegressor``: a network of its own class whose blocks sit in an
``nn.ModuleList`` and whose forward loops over them; it names no boundary, so the blocks are split evenly.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset


class SequentialRegressor(L.LightningModule):
    """Eight Linear+Tanh layers then a head; ``pipeline_split_points`` puts the boundary after layer ``cut``."""

    def __init__(self, width: int = 16, cut: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))
        self.cut = cut

    def pipeline_split_points(self, stages: int) -> list[str]:
        """Stage 1 begins at layer ``cut`` (two stages only)."""
        return [str(self.cut)] if stages == 2 else []

    def pipeline_loss(self, output: Tensor, target: Tensor) -> Tensor:
        """The mean squared error of one micro-batch."""
        return F.mse_loss(output, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Its own step (one process, DDP): the same loss."""
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """``val/mse`` over the whole validation set."""
        x, y = batch
        self.log("val/mse", F.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum (state per parameter, so a resume needs the optimizer's state)."""
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Block(nn.Module):
    """A residual Linear+Tanh block (the shape of a transformer's block, cut to one layer)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        """``x + tanh(linear(x))``."""
        return x + torch.tanh(self.linear(x))


class BlockNet(nn.Module):
    """An input layer, four blocks in a ModuleList, a head: a stage keeps its own and the others are Identity."""

    def __init__(self, width: int, blocks: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor) -> Tensor:
        """The input layer, every block in order, the head."""
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class BlockListRegressor(SequentialRegressor):
    """The same steps over a :class:`BlockNet`, without ``pipeline_split_points``: its blocks split evenly."""

    def __init__(self, width: int = 16) -> None:
        super().__init__(width)
        self.net = BlockNet(width)

    pipeline_split_points = None  # type: ignore[assignment]


class RandomRegression(L.LightningDataModule):
    """64 + 32 fixed random samples of ``y = sum(sin(x))``."""

    def __init__(self, width: int = 16, batch_size: int = 8) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(96, width, generator=generator)
        self.data = TensorDataset(x, x.sin().sum(dim=1, keepdim=True))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        """The first 64 samples."""
        return DataLoader(torch.utils.data.Subset(self.data, range(64)), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        """The last 32."""
        return DataLoader(torch.utils.data.Subset(self.data, range(64, 96)), batch_size=self.batch_size)


class WithoutPipelineLoss(SequentialRegressor):
    """The same module whose loss lives only in its steps: a pipeline cannot call it, so refuses it."""

    pipeline_loss = None  # type: ignore[assignment]
