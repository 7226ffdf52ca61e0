"""Plain-Lightning datamodules and datasets of the conformance lane, written as users write them.

Every sample is ``(index, x, y)``: a regression target of 8 features, with the sample's index in its dataset so
that a module can record which validation samples it evaluated (check (c) of docs/conformance.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, Sampler

TRAIN, VAL = 96, 29  # 29: an odd validation set, so that 2 ranks cannot split it evenly
FEATURES = 8


class Points(Dataset):
    """``size`` samples ``(index, x, y)`` with ``y = x @ w + 0.1 * noise``, the same for a given ``seed``."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=generator)
        w = torch.linspace(-1.0, 1.0, FEATURES)
        self.y = (self.x @ w + 0.1 * torch.randn(size, generator=generator)).unsqueeze(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[int, Tensor, Tensor]:
        return index, self.x[index], self.y[index]


class PointsData(L.LightningDataModule):
    """The plain datamodule: a shuffled training loader, validation / test / predict in order."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        """The splits."""
        self.train, self.val = Points(TRAIN, seed=1), Points(VAL, seed=2)

    def train_dataloader(self) -> DataLoader:
        """Shuffled."""
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """In order."""
        return DataLoader(self.val, batch_size=8)

    def test_dataloader(self) -> DataLoader:
        """The validation split again."""
        return DataLoader(self.val, batch_size=8)

    def predict_dataloader(self) -> DataLoader:
        """The validation split again."""
        return DataLoader(self.val, batch_size=8)


class SeveralEvalLoaders(PointsData):
    """Two validation, test and predict loaders (the second a different split of its own)."""

    def setup(self, stage: str | None = None) -> None:
        """A second evaluation split."""
        super().setup(stage)
        self.other = Points(13, seed=3)

    def val_dataloader(self) -> list[DataLoader]:
        """Two loaders: ``dataloader_idx`` 0 and 1."""
        return [DataLoader(self.val, batch_size=8), DataLoader(self.other, batch_size=4)]

    def test_dataloader(self) -> list[DataLoader]:
        """Two loaders."""
        return self.val_dataloader()

    def predict_dataloader(self) -> list[DataLoader]:
        """Two loaders."""
        return self.val_dataloader()


class CombinedTraining(PointsData):
    """Training on a ``CombinedLoader`` of two loaders (a dict batch ``{"a": ..., "b": ...}``)."""

    def train_dataloader(self) -> CombinedLoader:
        """Two halves of the training set, one batch of each per step."""
        half = TRAIN // 2
        first = torch.utils.data.Subset(self.train, range(half))
        second = torch.utils.data.Subset(self.train, range(half, TRAIN))
        loaders = {"a": DataLoader(first, batch_size=8, shuffle=True), "b": DataLoader(second, batch_size=8)}
        return CombinedLoader(loaders, mode="max_size_cycle")


class PointStream(IterableDataset):
    """The training set as a stream, in order."""

    def __init__(self, data: Points) -> None:
        self.data = data

    def __iter__(self) -> Iterator[tuple[int, Tensor, Tensor]]:
        return (self.data[i] for i in range(len(self.data)))


class StreamedTraining(PointsData):
    """An ``IterableDataset`` training loader."""

    def train_dataloader(self) -> DataLoader:
        """A stream."""
        return DataLoader(PointStream(self.train), batch_size=self.batch_size)


class EveryOtherFirst(Sampler[int]):
    """A user's sampler: the even indices, then the odd ones."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[int]:
        return iter([*range(0, self.size, 2), *range(1, self.size, 2)])

    def __len__(self) -> int:
        return self.size


class OwnSampler(PointsData):
    """A training loader with its own ``sampler``."""

    def train_dataloader(self) -> DataLoader:
        """The user's order."""
        return DataLoader(self.train, batch_size=self.batch_size, sampler=EveryOtherFirst(len(self.train)))


class LengthBuckets(BatchSampler):
    """A user's length-bucketing batch sampler: indices sorted by a "length" (here |y|), cut into batches."""

    def __init__(self, data: Points, batch_size: int) -> None:
        super().__init__(range(len(data)), batch_size, drop_last=False)
        self.order = torch.argsort(data.y.abs().squeeze(-1)).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        for start in range(0, len(self.order), self.batch_size):
            yield self.order[start : start + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch_size)


class OwnBatchSampler(PointsData):
    """A training loader with its own ``batch_sampler``."""

    def train_dataloader(self) -> DataLoader:
        """Batches by length."""
        return DataLoader(self.train, batch_sampler=LengthBuckets(self.train, self.batch_size))


class StatefulData(PointsData):
    """A datamodule with ``state_dict``: it counts the training batches it handed over; a resume restores the count."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__(batch_size)
        self.batches_given = 0

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Counted (training batches only)."""
        if self.trainer is not None and self.trainer.training:
            self.batches_given += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        """The count, saved in every checkpoint."""
        return {"batches_given": self.batches_given}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restored on resume."""
        self.batches_given = int(state["batches_given"])
