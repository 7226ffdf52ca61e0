"""Test-only stalls in plain Lightning code, chosen by ``HANG_FAULT`` (the rank and step come with it).

``HANG_FAULT`` is one of: ``train_step`` (rank 1 sleeps inside ``training_step`` at step 30), ``barrier``
(rank 1 calls a barrier at step 30 that rank 0 never calls), ``worker`` (rank 1's DataLoader worker blocks
in ``__getitem__``), ``val_end`` (rank 0 stalls in a callback's ``on_validation_epoch_end`` after the first
epoch). ``HANG_STAMP`` names a file that receives the wall-clock time of the stall. The code is what users
write: a LightningModule, a LightningDataModule with a worker, a Callback.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from project.data.digits import DigitsDataModule
from project.models.classifier import Classifier

STEP = 30
#: Samples rank 1's worker loads in an epoch before it blocks (a rank loads about 630 per epoch).
WORKER_ITEMS = 300


def fault() -> str:
    """The stall this run asks for ("" for none)."""
    return os.environ.get("HANG_FAULT", "")


def stall_forever() -> None:
    """Note when, then sleep far longer than any timeout (the job must end it)."""
    if os.environ.get("HANG_STAMP"):
        Path(os.environ["HANG_STAMP"]).write_text(f"{time.time()}\n")
    time.sleep(3600)


class HangingClassifier(Classifier):
    """The digits classifier; at step 30 rank 1 sleeps in ``training_step``, or calls a barrier alone."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Stall as ``HANG_FAULT`` says, then train as usual."""
        if self.trainer.global_step == STEP and self.trainer.global_rank == 1:
            if fault() == "train_step":
                stall_forever()
            if fault() == "barrier":
                if os.environ.get("HANG_STAMP"):
                    Path(os.environ["HANG_STAMP"]).write_text(f"{time.time()}\n")
                dist.barrier()  # only this rank calls it: rank 0 goes on to the gradient all-reduce
        return super().training_step(batch, batch_idx)


class BlockingSet(Dataset):
    """A dataset whose ``__getitem__`` blocks on rank 1 after :data:`WORKER_ITEMS` samples (``HANG_FAULT=worker``)."""

    def __init__(self, data: Dataset, rank: int) -> None:
        self.data, self.rank, self.loaded = data, rank, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        self.loaded += 1
        if fault() == "worker" and self.rank == 1 and self.loaded > WORKER_ITEMS:
            stall_forever()
        return self.data[index]


class HangingDigits(DigitsDataModule):
    """The digits; under ``HANG_FAULT=worker`` the training set is loaded by one worker process per rank."""

    def train_dataloader(self) -> DataLoader:
        """Shuffled, as users write it; a worker only where it is the fault (each epoch's worker costs time)."""
        data = BlockingSet(self.train_set, self.trainer.global_rank)
        workers = 1 if fault() == "worker" else 0
        return DataLoader(data, batch_size=self.batch_size, shuffle=True, num_workers=workers)


class StallInCallback(L.Callback):
    """A user callback: rank 0 stalls in ``on_validation_epoch_end`` after the first epoch (``HANG_FAULT=val_end``)."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stall once training has started (not in the sanity check)."""
        if fault() == "val_end" and trainer.global_rank == 0 and not trainer.sanity_checking:
            stall_forever()
