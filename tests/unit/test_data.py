"""The datamodules: shapes, split sizes, determinism, loader settings."""

from __future__ import annotations

import pytest
import torch

from bench.synthetic import SyntheticDataModule
from project.data.arrays import split_sizes
from project.data.digits import DigitsDataModule


def test_digits_shapes_and_split_sizes():
    data = DigitsDataModule(batch_size=32)
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (1257, 270, 270)
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == (32, 64) and x.dtype == torch.float32 and x.min() >= 0.0 and x.max() <= 1.0
    assert y.shape == (32,) and y.dtype == torch.int64 and set(y.tolist()) <= set(range(10))


def test_digits_split_is_deterministic_and_seeded():
    def test_labels(seed: int) -> list[int]:
        data = DigitsDataModule(seed=seed)
        data.setup("test")
        return data.test_set.tensors[1].tolist()

    assert test_labels(0) == test_labels(0)
    assert test_labels(0) != test_labels(1)


def test_splits_do_not_overlap():
    """Every sample in exactly one split: the splits' (image, label) rows are the dataset's, as a multiset.

    The digits hold some identical images, so the rows are counted, not collected into a set: a sample in two
    splits (or in none) changes a count.
    """
    from collections import Counter

    from project.data.arrays import load_digits_tensors

    data = DigitsDataModule()
    data.setup("fit")
    x, y = load_digits_tensors()
    everything = Counter((tuple(a.tolist()), int(b)) for a, b in zip(x, y, strict=True))
    splits = (data.train_set, data.val_set, data.test_set)
    split = Counter((tuple(a.tolist()), int(b)) for s in splits for a, b in zip(*s.tensors, strict=True))
    assert split == everything


def test_training_order_is_deterministic_and_eval_is_unshuffled():
    first, second = DigitsDataModule(batch_size=16), DigitsDataModule(batch_size=16)
    for data in (first, second):
        data.setup("fit")
    assert torch.equal(next(iter(first.train_dataloader()))[0], next(iter(second.train_dataloader()))[0])
    val = torch.cat([x for x, _ in first.val_dataloader()])
    assert torch.equal(val, first.val_set.tensors[0])


def test_synthetic_sizes_and_width():
    data = SyntheticDataModule(num_samples=1000, in_features=32, num_classes=5, batch_size=50)
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (800, 100, 100)
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == (50, 32) and int(y.max()) < 5


def test_loader_settings_reach_the_dataloader():
    data = DigitsDataModule(batch_size=8, num_workers=1, pin_memory=False, persistent_workers=True)
    data.setup("fit")
    loader = data.train_dataloader()
    assert (loader.batch_size, loader.num_workers, loader.pin_memory, loader.persistent_workers) == (8, 1, False, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"num_workers": -1}, "num_workers=-1"),
        ({"val_fraction": 0.0}, "val_fraction=0.0"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "must be < 1"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DigitsDataModule(**kwargs)


def test_split_sizes_add_up():
    assert sum(split_sizes(1797, 0.15, 0.15)) == 1797
