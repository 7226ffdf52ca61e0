"""The diabetes regression set as plain tensors: loading, seeded split, standardisation; no Lightning import.

So a plain Python process (e.g. one that rebuilds an exported network) sees the very same split and scaling.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from project.data.arrays import seeded_split, split_sizes

#: Samples in scikit-learn's embedded diabetes set (10 features each).
DIABETES_SIZE = 442


def diabetes_tensors(
    val_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Return the (train, val, test) splits, each of float32 ``x`` [N, 10] and float32 ``y`` [N].

    ``x`` is standardised per feature and ``y`` scaled to zero mean and unit std, both with the
    train split's statistics, so that no information from val/test leaks into the scaling.

    Args:
        val_fraction: Share of the 442 samples held out for validation, in (0, 1).
        test_fraction: Share held out for the test, in (0, 1); the two together must be < 1.
        seed: Seed of the one permutation that splits the samples.

    Raises:
        ValueError: A fraction is outside (0, 1) or the two add up to 1 or more.
    """
    from sklearn.datasets import load_diabetes  # here: `import sklearn` costs ~0.7 s, paid only when loading

    bunch = load_diabetes()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    y = torch.tensor(bunch.target, dtype=torch.float32)
    sizes = split_sizes(len(x), val_fraction, test_fraction)
    splits = seeded_split(x, y, sizes, seed)
    train_x, train_y = splits[0].tensors
    x_mean, x_std = train_x.mean(0), train_x.std(0).clamp_min(1e-12)
    y_mean, y_std = train_y.mean(), train_y.std().clamp_min(1e-12)
    train, val, test = (
        TensorDataset((part.tensors[0] - x_mean) / x_std, (part.tensors[1] - y_mean) / y_std) for part in splits
    )
    return train, val, test
