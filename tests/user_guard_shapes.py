"""User code for the own-batch-sampler tests (and the guards layer's): written as users write it.

- :func:`own_every_10_steps`: the own-module skeleton config, saving every 10 steps (kill points are steps).
- :class:`BucketBatches` (a plain Sampler yielding index lists) and :class:`BucketBatchSampler` (a torch
  BatchSampler subclass): length-bucketing batch samplers over variable-length sequences, padded by
  :func:`pad_collate`; :class:`LongestFirstShuffled` an index sampler drawing from torch's global generator;
  :class:`SequenceData` is their datamodule, :class:`SequenceClassifier` a masked model.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, SequentialSampler

from helpers import CONFIGS, atomic_write_text


def own_every_10_steps() -> str:
    """``configs/own_module.yaml`` whose ``last.ckpt`` is also saved every 10 steps (a kill point's checkpoint)."""
    text = (
        (CONFIGS / "own_module.yaml").read_text().replace("every_s: 60\n", "every_s: 60\n        every_n_steps: 10\n")
    )
    assert "every_n_steps: 10" in text
    path = Path(tempfile.gettempdir()) / f"own-every-10-steps-{hashlib.sha1(text.encode()).hexdigest()[:12]}.yaml"
    if not path.exists():
        atomic_write_text(path, text)
    return str(path)


class Sequences(Dataset):
    """``count`` integer sequences of lengths 3 to 12; the label is whether their sum is even."""

    def __init__(self, count: int = 480, seed: int = 3) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 13, (count,), generator=generator)
        self.items = [torch.randint(0, 16, (int(n),), generator=generator) for n in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        seq = self.items[index]
        return seq, int(seq.sum()) % 2


def pad_collate(samples: list[tuple[Tensor, int]]) -> dict[str, Tensor]:
    """Pad to the batch's longest sequence; a mask marks the real tokens."""
    longest = max(len(seq) for seq, _ in samples)
    tokens = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest)
    for row, (seq, _) in enumerate(samples):
        tokens[row, : len(seq)], mask[row, : len(seq)] = seq, 1.0
    return {"tokens": tokens, "mask": mask, "label": torch.tensor([label for _, label in samples])}


def _buckets(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches, the batches shuffled (seeded by seed and epoch)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    generator = torch.Generator().manual_seed(seed + epoch)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class BucketBatches(Sampler[list[int]]):
    """A plain Sampler that yields lists of indices of similar length (``DataLoader(batch_sampler=...)``)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0) -> None:
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle the buckets per epoch."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(_buckets(self.lengths, self.batch_size, self.seed, self.epoch))

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size


class BucketBatchSampler(BatchSampler):
    """The same bucketing as a torch ``BatchSampler`` subclass (over a sampler, as its constructor asks)."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool = True, lengths=None) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths

    def __iter__(self) -> Iterator[list[int]]:
        return iter(_buckets(self.lengths, self.batch_size, 0, 0))

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size


class LongestFirstShuffled(Sampler[int]):
    """A plain index Sampler: the longest half first, each half shuffled by torch's global generator."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __iter__(self) -> Iterator[int]:
        middle = sorted(self.lengths)[len(self.lengths) // 2]
        long = [i for i, n in enumerate(self.lengths) if n >= middle]
        short = [i for i, n in enumerate(self.lengths) if n < middle]
        return iter([group[i] for group in (long, short) for i in torch.randperm(len(group)).tolist()])

    def __len__(self) -> int:
        return len(self.lengths)


class SequenceData(L.LightningDataModule):
    """Variable-length sequences: ``form`` ``sampler`` (a plain Sampler of index lists as batch_sampler),
    ``batch_sampler`` (a BatchSampler subclass) or ``order`` (an index Sampler as sampler, with a batch_size).
    """

    def __init__(self, batch_size: int = 16, form: str = "sampler") -> None:
        super().__init__()
        self.batch_size, self.form = batch_size, form

    def setup(self, stage: str | None = None) -> None:
        """The sequences: the first 400 train, the rest validate."""
        data = Sequences()
        self.train = torch.utils.data.Subset(data, range(400))
        self.val = torch.utils.data.Subset(data, range(400, len(data)))

    def train_dataloader(self) -> DataLoader:
        """Batched by length."""
        lengths = [len(self.train[i][0]) for i in range(len(self.train))]
        if self.form == "order":  # an index sampler, batched by the loader
            order = LongestFirstShuffled(lengths)
            return DataLoader(self.train, batch_size=self.batch_size, sampler=order, collate_fn=pad_collate)
        if self.form == "sampler":
            batches = BucketBatches(lengths, self.batch_size)
        else:
            batches = BucketBatchSampler(SequentialSampler(self.train), self.batch_size, True, lengths)
        return DataLoader(self.train, batch_sampler=batches, collate_fn=pad_collate)

    def val_dataloader(self) -> DataLoader:
        """In order."""
        return DataLoader(self.val, batch_size=16, collate_fn=pad_collate)


class MaskedBag(nn.Module):
    """Embeddings averaged over the real tokens (the padding masked out), then a linear head."""

    def __init__(self, vocab: int = 16, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Logits of each sequence."""
        mask = mask.unsqueeze(-1)
        return self.head((self.embed(tokens) * mask).sum(1) / mask.sum(1))


class SequenceClassifier(L.LightningModule):
    """Parity of variable-length sequences; its loss does not depend on how much padding a batch has."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.net = MaskedBag()

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(self.net(batch["tokens"], batch["mask"]), batch["label"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy over the batch."""
        loss = self._loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """Validation loss."""
        self.log("val/loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD."""
        return torch.optim.SGD(self.parameters(), lr=self.lr)
