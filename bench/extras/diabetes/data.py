"""The regression row's data: a synthetic regression set behind a plain LightningDataModule.

Plain on purpose, as a user writes one (ordinary shuffled DataLoaders, nothing from ``project.data``): the
template gives it its sampler like any datamodule. Its training loader's generator is seeded with ``seed``,
which the template's loader layer takes as the shuffling seed, and which ``bench/raw.py`` and
``bench/plain.py`` get as ``--data-seed``: the same batches in the same order.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.data.arrays import seeded_split, split_sizes


def make_regression(num_samples: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets from a fixed random two-layer function of Gaussian inputs, plus noise: learnable, deterministic."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_features, generator=generator)
    hidden = torch.tanh(x @ torch.randn(in_features, 32, generator=generator) / in_features**0.5)
    y = hidden @ torch.randn(32, generator=generator) + 0.1 * torch.randn(num_samples, generator=generator)
    return x, y


class SyntheticRegression(L.LightningDataModule):
    """Synthetic regression data (``[N, in_features]`` inputs, one float target each).

    Args:
        num_samples: Samples before the split.
        in_features: Width of each input.
        batch_size: Samples per training batch.
        eval_fraction: Share held out for validation, and again for the test.
        seed: Seed of the data, the split and the shuffling.
    """

    def __init__(
        self, num_samples: int, in_features: int = 16, batch_size: int = 32, eval_fraction: float = 0.01, seed: int = 0
    ) -> None:
        super().__init__()
        self.num_samples, self.in_features, self.batch_size = num_samples, in_features, batch_size
        self.eval_fraction, self.seed = eval_fraction, seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.test_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        """Generate and split the data once."""
        if self.train_set is None:
            x, y = make_regression(self.num_samples, self.in_features, self.seed)
            sizes = split_sizes(self.num_samples, self.eval_fraction, self.eval_fraction)
            self.train_set, self.val_set, self.test_set = seeded_split(x, y, sizes, self.seed)

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (the generator's seed is the shuffling seed)."""
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in order."""
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        """Test batches in order."""
        return DataLoader(self.test_set, batch_size=self.batch_size)
