"""Random augmentation that does not depend on the layout (world size, workers): each sample's generator is its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset


class EpochIndex(NamedTuple):
    """A training index with the epoch it belongs to (what the layer's sampler yields for this dataset)."""

    epoch: int
    index: int


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator of sample ``index`` in ``epoch``: the same wherever and whenever it is drawn."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 2_147_483_629 + index)


class SeededAugmentation(Dataset):
    """A map-style dataset whose training samples are augmented with their own seeded generator.

    Args:
        dataset: The samples.
        transform: ``transform(sample, generator) -> sample``; draw every random number from ``generator``.
        seed: Base seed of the augmentation.
    """

    def __init__(self, dataset: Dataset, transform: Callable[[Any, torch.Generator], Any], seed: int = 0) -> None:
        self.dataset, self.transform, self.seed = dataset, transform, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int | EpochIndex) -> Any:
        if not isinstance(index, tuple):
            return self.dataset[index]  # evaluation: the sample as it is
        epoch, position = index
        return self.transform(self.dataset[position], sample_generator(self.seed, epoch, position))
