"""User-shaped code that is not classification-shaped: plugged in by class path (``tests/`` is on PYTHONPATH).

- :class:`NoTestStepModule`: a LightningModule with training and validation but no ``test_step`` (as most GANs and
  language models are written); it logs ``val/acc`` so that ``configs/digits.yaml``'s checkpointing works.
- :class:`FailingTestCallback`: a callback whose test refuses (as a checkpoint the test cannot read would), to
  prove that a failure after training keeps everything the run wrote.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn

from project.errors import UserError


class SmallNet(nn.Module):
    """64 -> hidden -> 10; records its constructor arguments so that its export rebuilds."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.init_args = {"hidden": hidden}
        self.layers = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: Tensor) -> Tensor:
        """Logits."""
        return self.layers(x)


class NoTestStepModule(L.LightningModule):
    """A digits classifier whose network is built in ``__init__``, with no ``test_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SmallNet()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Validation loss and accuracy."""
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FailingTestCallback(L.Callback):
    """Refuses the test stage, as an unreadable best checkpoint would, after training finished."""

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse."""
        raise UserError("the test data is not reachable (raised on purpose by FailingTestCallback)")
