"""scikit-learn's embedded diabetes regression set (442 samples x 10 features, no download).

A deliberately plain :class:`lightning.LightningDataModule` with ordinary DataLoaders: nothing from
``project.data.base``, so it shows what the template does with any user's datamodule.
"""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader, TensorDataset

from project.data.arrays import split_sizes
from project.extras.diabetes.arrays import DIABETES_SIZE, diabetes_tensors


class DiabetesDataModule(L.LightningDataModule):
    """The diabetes set, standardised with train statistics, split by one seeded permutation.

    Args:
        batch_size: Samples per batch (>= 1).
        num_workers: DataLoader worker processes.
        val_fraction: Share of the samples held out for validation, in (0, 1).
        test_fraction: Share held out for the test (and predict), in (0, 1); both together < 1.
        seed: Seed of the split.
    """

    def __init__(
        self,
        batch_size: int = 32,
        num_workers: int = 0,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        split_sizes(DIABETES_SIZE, val_fraction, test_fraction)  # fractions in (0, 1), sum < 1
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.test_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        """Load, split and standardise the data once (later calls return at once)."""
        if self.train_set is not None:
            return
        self.train_set, self.val_set, self.test_set = diabetes_tensors(self.val_fraction, self.test_fraction, self.seed)

    def _loader(self, dataset: TensorDataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("DiabetesDataModule.setup() must run before its dataloaders are asked for")
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches."""
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in order."""
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches in order."""
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """The test set, in order (predictions line up with its rows)."""
        return self._loader(self.test_set, shuffle=False)
