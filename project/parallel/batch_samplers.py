"""Your own ``batch_sampler`` (length bucketing, token budgets) with the same global batches at any world size.

Each batch the user's batch sampler yields is one *global* batch: every rank draws them alike (in a fork of torch's
and Python's random state seeded by the run's seed + epoch) and takes its contiguous slice, so DDP's average is the
batch's mean (a batch the data-parallel size does not divide is refused: unequal slices would weigh samples
unequally). As a ``DistributedSampler``, Lightning keeps it instead of re-instantiating the user's around its own.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset

from project.errors import UserError
from project.parallel.sampler_install import Guarantee, rebuild_loader, replaceable_sampler
from project.plan.resolve import Plan


@contextmanager
def seeded_random_state(seed: int) -> Iterator[None]:
    """Inside: the global random state of torch and Python seeded by ``seed``; put back after."""
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)


class BatchListView(Dataset):
    """``dataset[[i, j, ...]]`` is the list of those samples: what a pre-made batch of indices fetches."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, indices: list[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        return list(getitems(indices)) if callable(getitems) else [self.dataset[i] for i in indices]

    def __len__(self) -> int:
        return len(self.dataset)


class ShardedBatchSampler(DistributedSampler):
    """This rank's slice of each global batch of the user's ``batch_sampler``, drawn in random state seed + epoch."""

    def __init__(
        self, batch_sampler: Any, dataset: Any, num_replicas: int, rank: int, seed: int, name: str = ""
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, seed=seed)
        self.batch_sampler = batch_sampler
        self.name = name or f"batch_sampler {type(batch_sampler).__name__}"
        #: (epoch, global batches already trained on) from a mid-epoch checkpoint; used once.
        self.resume_point: tuple[int, int] | None = None
        self.num_global_batches = len(batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Lightning's epoch, passed on to the user's sampler (and its sampler) where they take it."""
        super().set_epoch(epoch)
        for sampler in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)

    def global_batches(self) -> list[list[int]]:
        """This epoch's global batches, the same on every rank."""
        with seeded_random_state(self.seed + self.epoch):
            return [list(batch) for batch in self.batch_sampler]

    def slice_of(self, batch: list[int]) -> list[int]:
        """This rank's contiguous share of ``batch`` (refused unless the data-parallel size divides it)."""
        if len(batch) % self.num_replicas:
            raise UserError(
                f"the training loader's {self.name} yields a batch of {len(batch)} samples, which "
                f"{self.num_replicas} data-parallel processes cannot share equally (each global batch is split "
                f"across them); make every batch a multiple of {self.num_replicas}, e.g. drop or pad the last one"
            )
        share = len(batch) // self.num_replicas
        return batch[self.rank * share : (self.rank + 1) * share]

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's slice of each global batch not trained on yet, drawn once the epoch is set (generator)."""
        skip = self.resume_point[1] if self.resume_point and self.resume_point[0] == self.epoch else 0
        self.resume_point = None
        yield from [self.slice_of(batch) for batch in self.global_batches()[skip:]]  # a bad size before any of them

    def __len__(self) -> int:
        """Global batches of a whole epoch (one per step of this rank)."""
        return self.num_global_batches


def own_batching(loader: Any) -> Any | None:
    """The user's own batch_sampler or sampler (one the layer's would change) deciding the batches, or ``None``."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    batch_sampler = loader.batch_sampler
    if isinstance(getattr(batch_sampler, "sampler", loader.sampler), DistributedSampler):
        return None  # sharded per rank by the user already, as in a raw DDP script: left as it is
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return batch_sampler
    plain = type(loader) is DataLoader and loader.batch_size is not None
    return loader.sampler if plain and not replaceable_sampler(loader.sampler, loader.dataset) else None


def _global_batches(loader: Any, own: Any, plan: Plan) -> tuple[Any, str]:
    """The user's batches (its batch_sampler's, or its sampler's order cut at the plan's size) and their name."""
    name = type(own).__name__
    if plan.micro_batch == "auto":
        raise UserError(
            f"parallel.micro_batch='auto' tries batches of the layer's own sampler, and the training loader has its "
            f"own {name}; set parallel.micro_batch to a number"
        )
    if own is not loader.sampler:
        if plan.per_device_batch_size is not None:
            raise UserError(
                f"the training loader batches with its own batch_sampler {name}, whose batches are the global "
                f"batches; parallel.global_batch_size and per_device_batch_size={plan.per_device_batch_size} set a "
                "size it decides: remove them (parallel.accumulation still applies)"
            )
        return own, f"batch_sampler {name}"
    size = plan.loader_batches[0] * plan.dp_size
    return BatchSampler(own, size, drop_last=True), f"sampler {name} (its order cut into global batches of {size})"


def install_batch_sampler(loader: Any, plan: Plan, global_rank: int, run_seed: int) -> tuple[Any, Guarantee]:
    """The training loader whose own batches (:func:`own_batching`) are split across the data-parallel ranks."""
    own = own_batching(loader)
    if type(loader) is not DataLoader:
        raise UserError(
            f"the training loader is a DataLoader subclass ({type(loader).__name__}) with its own batch_sampler "
            f"{type(own).__name__}, which the layer cannot rebuild to split each batch across processes; use a "
            "plain torch.utils.data.DataLoader(dataset, batch_sampler=..., collate_fn=...)"
        )
    batches, what = _global_batches(loader, own, plan)
    sampler = ShardedBatchSampler(batches, loader.dataset, plan.dp_size, plan.dp_rank(global_rank), run_seed, what)
    for batch in sampler.global_batches():  # the first epoch's batches: a bad size is refused before training
        sampler.slice_of(batch)
    if sampler.num_global_batches == 0:
        raise UserError(f"the training loader's {what} yields no batch; give it more samples or smaller batches")
    detail = (
        f"the global batches of the loader's own {what}, {sampler.num_global_batches} an epoch drawn with seed "
        f"{run_seed} + epoch, each split into {plan.dp_size} equal slice(s): the same at any world size"
    )
    return rebuild_loader(loader, sampler, None, BatchListView(loader.dataset)), Guarantee(True, detail)
