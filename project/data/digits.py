"""The embedded default data: scikit-learn's handwritten digits (1,797 8x8 images, no download)."""

from __future__ import annotations

from typing import Any

from project.data.arrays import load_digits_tensors, seeded_split, split_sizes
from project.data.base import TensorDataModule


class DigitsDataModule(TensorDataModule):
    """The digits set with a seeded, deterministic train/val/test split.

    Args:
        val_fraction: Share of the 1,797 samples held out for validation.
        test_fraction: Share held out for the test.
        **loader: Loader settings of :class:`project.data.base.TensorDataModule` (``batch_size``, ``seed``, ...).
    """

    def __init__(self, val_fraction: float = 0.15, test_fraction: float = 0.15, **loader: Any) -> None:
        super().__init__(**loader)
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
