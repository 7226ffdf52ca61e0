"""The data as plain tensors, loaded and split by seed without Lightning: a plain process sees the same split."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset


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
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, val, test = (TensorDataset(x[idx], y[idx]) for idx in torch.split(order, list(sizes)))
    return train, val, test


def sklearn_data_file(name: str) -> Path:
    """A data file shipped in ``sklearn/datasets/data``, found without ``import sklearn`` (0.7 s: it imports scipy)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("scikit-learn is not installed (pip install scikit-learn): it ships the data")
    return Path(spec.origin).parent / "datasets" / "data" / name


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as (float32 images in [0, 1] of shape [N, 64], int64 labels), as ``load_digits()`` has them."""
    with gzip.open(sklearn_data_file("digits.csv.gz"), "rt") as handle:
        data = np.loadtxt(handle, delimiter=",")
    x = torch.tensor(data[:, :-1], dtype=torch.float32) / 16.0
    y = torch.tensor(data[:, -1].astype(np.int64))
    return x, y
