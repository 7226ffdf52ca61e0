"""World-size-invariant batching; both samplers subclass ``DistributedSampler`` so that Lightning keeps them.

They are ``SequentialSampler``s too: under ``overfit_batches`` Lightning replaces any other sampler with one over the
whole dataset on every rank (each rank would then train and evaluate on the same samples).

Training: one seeded permutation per epoch is cut into *global* batches of ``B = b x world_size``, rank ``r`` taking
``[r*b, (r+1)*b)`` of each: the same batches at any world size, DDP's average the mean over ``B``. Evaluation: one
contiguous, unpadded shard per rank, each sample once (DistributedSampler would repeat samples to even the shards).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import DistributedSampler, SequentialSampler

from project.data.augment import EpochIndex


def _check_rank(num_replicas: int, rank: int) -> None:
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank={rank} must be in [0, {num_replicas}) and num_replicas={num_replicas} >= 1")


class GlobalBatchSampler(DistributedSampler, SequentialSampler):
    """Training sampler whose global batches do not depend on the world size.

    ``batch_size``: the per-device ``b``; ``shuffle``: seeded ``seed + epoch``; an epoch is whole optimizer steps.
    ``with_epoch``: yield ``EpochIndex(epoch, index)`` for a :class:`project.data.augment.SeededAugmentation`.
    """

    def __init__(
        self,
        dataset: Sized,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        accumulation: int = 1,
        with_epoch: bool = False,
    ) -> None:
        _check_rank(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.with_epoch = with_epoch
        #: Samples of one global micro-batch (all ranks' batches side by side); a step is ``accumulation`` of them.
        self.samples_per_micro_step = batch_size * num_replicas
        step = self.samples_per_micro_step * accumulation  # samples per optimizer step
        self.num_global_batches = len(dataset) // step * accumulation
        if self.num_global_batches == 0:
            times = f" x accumulation {accumulation}" if accumulation > 1 else ""
            raise ValueError(
                f"the dataset has {len(dataset)} samples, fewer than one global batch of "
                f"{step} ({batch_size} x {num_replicas} processes{times}); lower the batch size"
            )
        # (epoch, global batches already trained on) from a mid-epoch checkpoint; used once.
        self.resume_point: tuple[int, int] | None = None

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.dataset))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator)

    def __iter__(self) -> Iterator[int | EpochIndex]:
        """Yield this rank's indices, global batch after global batch."""
        order = self._order()
        skip = self.resume_point[1] if self.resume_point and self.resume_point[0] == self.epoch else 0
        self.resume_point = None
        start, stop = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        for k in range(skip, self.num_global_batches):
            indices = order[k * self.samples_per_micro_step :][start:stop].tolist()
            yield from (EpochIndex(self.epoch, i) for i in indices) if self.with_epoch else indices

    def first_indices(self, count: int) -> list[int | EpochIndex]:
        """The first ``count`` indices of this epoch's order, as ``__iter__`` yields them (a trial micro-batch)."""
        indices = self._order()[:count].tolist()
        return [EpochIndex(self.epoch, i) for i in indices] if self.with_epoch else indices

    def __len__(self) -> int:
        """Samples of a whole epoch on this rank, in a resumed one too (Lightning counts on from where it stopped)."""
        return self.num_global_batches * self.batch_size


class EvalShardSampler(DistributedSampler, SequentialSampler):
    """Evaluation sampler: contiguous, unpadded shards of the first ``num_samples`` (all), each sample once."""

    def __init__(self, dataset: Sized, num_replicas: int = 1, rank: int = 0, num_samples: int | None = None) -> None:
        _check_rank(num_replicas, rank)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        total = len(dataset) if num_samples is None else num_samples
        if not 0 <= total <= len(dataset):
            raise ValueError(f"num_samples={num_samples} must be in [0, {len(dataset)}] (the dataset's length)")
        size, extra = divmod(total, num_replicas)
        # The first `extra` ranks take one sample more; nothing is repeated.
        self.start = rank * size + min(rank, extra)
        self.stop = self.start + size + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        """Yield this rank's shard in order."""
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        """Size of this rank's shard."""
        return self.stop - self.start
