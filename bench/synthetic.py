"""A synthetic classification set of any size and width: the data of the benchmarks' MLP rows."""

from __future__ import annotations

from typing import Any

import torch

from project.data.arrays import seeded_split, split_sizes
from project.data.base import TensorDataModule


def make_blobs(num_samples: int, in_features: int, num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters around seeded class centres: learnable, deterministic, any size."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, in_features, generator=generator) * 2.0
    y = torch.randint(num_classes, (num_samples,), generator=generator)
    x = centres[y] + torch.randn(num_samples, in_features, generator=generator)
    return x, y


class SyntheticDataModule(TensorDataModule):
    """Synthetic Gaussian-cluster classification data.

    Args:
        num_samples: Total samples before the split.
        in_features: Width of each sample.
        num_classes: Number of clusters/labels.
        val_fraction: Share held out for validation.
        test_fraction: Share held out for the test.
        **loader: Loader settings of :class:`project.data.base.TensorDataModule`.
    """

    def __init__(
        self,
        num_samples: int = 4096,
        in_features: int = 64,
        num_classes: int = 10,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        **loader: Any,
    ) -> None:
        super().__init__(**loader)
        self.save_hyperparameters()
        if num_samples < 1 or in_features < 1 or num_classes < 2:
            raise ValueError(
                f"num_samples={num_samples}, in_features={in_features}, num_classes={num_classes}: "
                "need num_samples >= 1, in_features >= 1 and num_classes >= 2"
            )
        self.num_samples, self.in_features, self.num_classes = num_samples, in_features, num_classes
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        split_sizes(num_samples, val_fraction, test_fraction)

    def setup(self, stage: str | None = None) -> None:
        """Generate the data (seeded) and split it."""
        if self.train_set is not None:
            return
        x, y = make_blobs(self.num_samples, self.in_features, self.num_classes, self.seed)
        sizes = split_sizes(self.num_samples, self.val_fraction, self.test_fraction)
        self.train_set, self.val_set, self.test_set = seeded_split(x, y, sizes, self.seed)
