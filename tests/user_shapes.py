"""User-shaped code that is not classification-shaped: plugged in by class path (``tests/`` is on PYTHONPATH).

- :class:`NoTestStepModule`: a LightningModule with training and validation but no ``test_step`` (as most GANs and
  language models are written); it logs ``val/acc`` so that ``configs/digits.yaml``'s checkpointing works.
- :class:`FailingTestCallback`: a callback whose test refuses (as a checkpoint the test cannot read would), to
  prove that a failure after training keeps everything the run wrote.
- :class:`ShuffledStreamDigits`: a training stream that reshuffles on every pass and keeps its pass count in
  ``state_dict``, as a stateful streaming dataset does.
- :class:`TinyLM` on :class:`CharWindowsData`: a language model with dict batches, its own optimizer, no test
  step, and a dict per sample from ``predict_step``.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset
from user_code import PlainDigits

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


class ShuffledStream(IterableDataset):
    """A stream that reshuffles on every pass, remembering how many passes it made: ``state_dict`` makes it resumable.

    Without its state a re-read would give another order, so a resume that re-reads it would be inexact.
    """

    def __init__(self, data: TensorDataset, seed: int = 7) -> None:
        self.data = data
        self.seed = seed
        self.passes = 0

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed + self.passes))
        self.passes += 1
        return (self.data[i] for i in order.tolist())

    def state_dict(self) -> dict[str, int]:
        """How many passes were made."""
        return {"passes": self.passes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from that pass."""
        self.passes = int(state["passes"])


class ShuffledStreamDigits(PlainDigits):
    """The digits' training split as a :class:`ShuffledStream`."""

    def train_dataloader(self) -> DataLoader:
        """A stateful stream."""
        return DataLoader(ShuffledStream(self.train), batch_size=self.bs)


class CharWindows(Dataset):
    """Windows of a repeating character sequence as dict samples ``{"tokens": LongTensor[block + 1]}``."""

    def __init__(self, length: int = 600, block: int = 8, vocab: int = 12) -> None:
        text = torch.arange(length + block + 1) % vocab
        self.windows = text.unfold(0, block + 1, 1)[:length]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"tokens": self.windows[index]}


class CharWindowsData(L.LightningDataModule):
    """Train/val/predict splits of :class:`CharWindows`, batched as dicts by the default collate."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        """Split by position."""
        data = CharWindows()
        self.train, self.val = Subset(data, range(500)), Subset(data, range(500, 600))

    def train_dataloader(self) -> DataLoader:
        """Shuffled."""
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """In order."""
        return DataLoader(self.val, batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        """The validation windows."""
        return DataLoader(self.val, batch_size=self.batch_size)


class TinyLM(L.LightningModule):
    """A next-token model on dict batches: loss in ``training_step``, a dict per sample from ``predict_step``."""

    def __init__(self, vocab: int = 12, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, vocab))

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["tokens"]
        logits = self.net(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Next-token cross-entropy."""
        return self._loss(batch)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """Validation loss."""
        self.log("val/loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """The predicted token after each window's last one, and its probability."""
        probs = self.net(batch["tokens"][:, -1]).softmax(-1)
        return {"next_token": probs.argmax(-1), "probability": probs.max(-1).values}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Its own AdamW."""
        return torch.optim.AdamW(self.parameters(), lr=0.05)
