"""Loader settings the project's tensor datamodules share; world-size-invariant batches are the parallel layer's."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset


class TensorBatches(Dataset):
    """A ``TensorDataset`` read a batch at a time (``__getitems__``): one gather per tensor, about 3x faster."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return [tensor[index] for tensor in self.dataset.tensors]  # a list, as default_collate makes of tuples


def collated(batch: list[Tensor]) -> list[Tensor]:
    """The ``collate_fn`` of :class:`TensorBatches`: its batches come out collated already."""
    return batch


class TensorDataModule(L.LightningDataModule):
    """Base of the project's datamodules: subclasses build ``self.train_set``/``val_set``/``test_set`` in ``setup``.

    Args:
        batch_size: The training loader's batch size: per device, global under dp; ``global_batch_size`` overrides it.
        num_workers: DataLoader worker processes (0 loads in the training process).
        pin_memory: Pin host memory for faster GPU copies; ``None`` means "when CUDA is available".
        persistent_workers: Keep workers alive between epochs (only with ``num_workers > 0``).
        shuffle: Reshuffle the training set every epoch.
        seed: Seed of the data split and of the shuffling (the loaders' generator); the same on every rank.
    """

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.shuffle = shuffle
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def _loader(self, dataset: Dataset | None, name: str, shuffle: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not build the {name} set")
        batched = type(dataset) is TensorDataset  # a subclass may change what one sample is
        collates_itself = batched or getattr(dataset, "returns_batches", False)  # e.g. the gpt layer's windows
        return DataLoader(
            TensorBatches(dataset) if batched else dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=collated if collates_itself else None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            # Its own generator: worker seeds drawn from the global one would shift dropout & co. in a resumed run.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        """The training set, shuffled by ``seed``."""
        return self._loader(self.train_set, "training", shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        """The validation set, in order."""
        return self._loader(self.val_set, "validation")

    def test_dataloader(self) -> DataLoader:
        """The test set, in order."""
        return self._loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        """Predictions run over the test set."""
        return self._loader(self.test_set, "predict")
