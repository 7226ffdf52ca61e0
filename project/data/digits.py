"""The embedded default data: scikit-learn's handwritten digits (1,797 8x8 images, no download)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from project.data.base import ShardedDataModule


def split_sizes(total: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """Return (train, val, test) sizes for ``total`` samples; fractions are rounded to whole samples."""
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value} must be in (0, 1)")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction = {val_fraction + test_fraction} must be < 1")
    n_val, n_test = round(total * val_fraction), round(total * test_fraction)
    return total - n_val - n_test, n_val, n_test


def seeded_split(
    x: torch.Tensor, y: torch.Tensor, sizes: tuple[int, int, int], seed: int
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Split tensors into train/val/test TensorDatasets by one seeded permutation (the same everywhere)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=generator)
    parts = torch.split(order, list(sizes))
    train, val, test = (TensorDataset(x[idx], y[idx]) for idx in parts)
    return train, val, test


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as (float32 images scaled to [0, 1] of shape [N, 64], int64 labels)."""
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return x, y


class DigitsDataModule(ShardedDataModule):
    """The digits set with a seeded, deterministic train/val/test split.

    Args:
        val_fraction: Share of the 1,797 samples held out for validation.
        test_fraction: Share held out for the test.
        **kwargs: Loader settings of :class:`project.data.base.ShardedDataModule`
            (``batch_size``, ``num_workers``, ``pin_memory``, ``persistent_workers``, ``shuffle``, ``seed``).
    """

    def __init__(
        self,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers, shuffle, seed)
        self.save_hyperparameters()
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        split_sizes(1797, val_fraction, test_fraction)  # validate early, before any process starts

    def setup(self, stage: str | None = None) -> None:
        """Load the embedded digits and split them (cheap: a bundled CSV)."""
        if self.train_set is not None:
            return
        x, y = load_digits_tensors()
        sizes = split_sizes(len(x), self.val_fraction, self.test_fraction)
        self.train_set, self.val_set, self.test_set = seeded_split(x, y, sizes, self.seed)
