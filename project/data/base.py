"""Shared loader logic: world-size-invariant training batches and exactly-once evaluation shards."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from project.parallel.sampling import EvalShardSampler, GlobalBatchSampler


class ShardedDataModule(L.LightningDataModule):
    """Base datamodule: subclasses build ``self.train_set``/``val_set``/``test_set`` in ``setup``.

    Args:
        batch_size: Per-device batch size (the ``parallel`` section may set it from a global batch).
        num_workers: DataLoader worker processes (0 loads in the training process).
        pin_memory: Pin host memory for faster GPU copies; ``None`` means "when CUDA is available".
        persistent_workers: Keep workers alive between epochs (only with ``num_workers > 0``).
        shuffle: Reshuffle the training set every epoch.
        seed: Seed of the data split and of the shuffling; the same on every rank.
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
        self._train_sampler: GlobalBatchSampler | None = None
        self._resume_point: tuple[int, int] | None = None

    def _world(self) -> tuple[int, int]:
        """(world size, global rank) of the attached trainer; (1, 0) outside a Trainer."""
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(self, dataset: Dataset | None, sampler: Any, name: str) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not build the {name} set")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        """Per-rank slices of world-size-invariant global batches."""
        world, rank = self._world()
        assert self.train_set is not None, "setup('fit') builds the training set"
        sampler = GlobalBatchSampler(
            self.train_set,
            self.batch_size,
            num_replicas=world,
            rank=rank,
            shuffle=self.shuffle,
            seed=self.seed,
        )
        sampler.resume_point, self._resume_point = self._resume_point, None
        self._train_sampler = sampler
        return self._loader(self.train_set, sampler, "training")

    def _eval_loader(self, dataset: Dataset | None, name: str) -> DataLoader:
        world, rank = self._world()
        sampler = EvalShardSampler(dataset, num_replicas=world, rank=rank) if dataset is not None else None
        return self._loader(dataset, sampler, name)

    def val_dataloader(self) -> DataLoader:
        """The validation set, one unpadded shard per rank."""
        return self._eval_loader(self.val_set, "validation")

    def test_dataloader(self) -> DataLoader:
        """The test set, one unpadded shard per rank."""
        return self._eval_loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        """Predictions run over the test set."""
        return self._eval_loader(self.test_set, "predict")

    def state_dict(self) -> dict[str, Any]:
        """Record how far into the epoch training got, so a mid-epoch resume skips what was seen."""
        trainer = self.trainer
        if trainer is None or self._train_sampler is None:
            return {}
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        return {"epoch": trainer.current_epoch, "batches_done": int(done)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume mid-epoch: the next training loader starts after the batches already trained on."""
        if "epoch" in state_dict:
            self._resume_point = (int(state_dict["epoch"]), int(state_dict["batches_done"]))
