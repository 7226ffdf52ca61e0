"""The parallel layer's guarantees, installed on the loaders of any datamodule (all else of a loader kept).

Training: :class:`~project.parallel.samplers.GlobalBatchSampler` or, for a stream,
:class:`~project.parallel.stream.GlobalBatchStream`; evaluation: :class:`~project.parallel.samplers.EvalShardSampler`.
A loader they would change the meaning of (an evaluation stream, a custom sampler or batch_sampler, a DataLoader
subclass) is left alone, and its :class:`Guarantee` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from project.data.augment import SeededAugmentation
from project.errors import UserError
from project.parallel.limits import (
    SETTINGS,
    EndAwareStream,
    Limit,
    evaluation_limit,
    is_whole,
    stream_limit,
    training_limit,
)
from project.parallel.samplers import EvalShardSampler, GlobalBatchSampler
from project.parallel.stream import GlobalBatchStream, is_stateful


@dataclass(frozen=True)
class Guarantee:
    """Whether a loader got the layer's sampler, and what that means (or why not)."""

    held: bool
    detail: str
    limit: Limit | None = None  # what the stage's limit_*_batches keeps, where the layer's sampler applies it

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``plan.json``."""
        data: dict[str, Any] = {"held": self.held, "detail": self.detail}
        return {**data, "limit": self.limit.to_dict()} if self.limit is not None else data


def _refusal(loader: Any) -> str | None:
    """Why the layer cannot put its sampler on ``loader`` without changing its meaning; ``None`` if it can."""
    if not isinstance(loader, DataLoader):
        return f"the loader is a {type(loader).__name__}, not a torch DataLoader"
    if type(loader) is not DataLoader:
        return f"the loader is a DataLoader subclass ({type(loader).__name__}) whose arguments the layer cannot rebuild"
    if isinstance(loader.dataset, IterableDataset):
        return "the dataset is an IterableDataset (no indices to sample)"
    if loader.batch_size is None:
        return "the loader has a custom batch_sampler (or no batching)"
    if type(loader.batch_sampler) is not BatchSampler:
        return f"the loader has a custom batch_sampler ({type(loader.batch_sampler).__name__})"
    if replaceable_sampler(loader.sampler, loader.dataset):
        return None
    return f"the loader has a custom sampler ({type(loader.sampler).__name__})"


def replaceable_sampler(sampler: Any, dataset: Any) -> bool:
    """Whether the layer's sampler keeps what ``sampler`` means: the layer's own, in order, or a plain shuffle."""
    if isinstance(sampler, (GlobalBatchSampler, EvalShardSampler, SequentialSampler)):
        return True
    return type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(dataset)


def takes_eval_sampler(loader: Any) -> bool:
    """Whether :func:`install_eval_sampler` can put the layer's sampler on ``loader``."""
    return _refusal(loader) is None


def rebuild_loader(loader: DataLoader, sampler: Any, batch_size: int | None, dataset: Any = None) -> DataLoader:
    """``loader`` again with ``sampler``, ``batch_size`` (``None``: the sampler's batches) and ``dataset``."""
    workers = loader.num_workers
    return DataLoader(
        loader.dataset if dataset is None else dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=False,  # the sampler already yields whole batches only
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers > 0 else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order,
    )


def install_training_sampler(
    loader: Any,
    per_device_batch_size: int,
    world_size: int,
    rank: int,
    run_seed: int,
    accumulation: int = 1,
    limit: int | float = 1.0,
) -> tuple[Any, Guarantee]:
    """The loader with world-size-invariant global batches (the Guarantee records ``limit``), or unchanged and why."""
    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return _install_stream(loader, per_device_batch_size, world_size, rank, accumulation, limit)
    if (refusal := _refusal(loader)) is not None:
        return loader, Guarantee(False, f"training batches depend on the world size: {refusal}")
    old = loader.sampler
    shuffle = old.shuffle if isinstance(old, GlobalBatchSampler) else not isinstance(old, SequentialSampler)
    sampler = GlobalBatchSampler(
        loader.dataset,
        per_device_batch_size,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=int(loader.generator.initial_seed()) if loader.generator is not None else run_seed,
        accumulation=accumulation,
        with_epoch=isinstance(loader.dataset, SeededAugmentation),
    )
    times = f" x accumulation {accumulation}" if accumulation > 1 else ""
    detail = (
        f"global batches of {sampler.samples_per_micro_step * accumulation} "
        f"({per_device_batch_size} per process x {world_size}{times}), "
        f"{'shuffled' if shuffle else 'in order'} with seed {sampler.seed}, the same at any world size"
    )
    kept = training_limit(limit, sampler.num_global_batches, sampler.samples_per_micro_step)
    if kept.samples != kept.total:
        detail += f"; {kept.describe()}"
    return rebuild_loader(loader, sampler, per_device_batch_size), Guarantee(True, detail, kept)


def _install_stream(
    loader: Any, per_device_batch_size: int, world_size: int, rank: int, accumulation: int, limit: int | float
) -> tuple[Any, Guarantee]:
    """A training stream cut into the same global batches at any world size (:mod:`project.parallel.stream`)."""
    refusal = None
    if type(loader) is not DataLoader:
        refusal = f"the loader is a {type(loader).__name__}, not a plain torch DataLoader"
    elif loader.batch_size is None:
        refusal = "the stream's loader batches by itself (batch_size=None)"
    elif loader.num_workers > 0:
        refusal = (
            f"the stream is read by {loader.num_workers} worker processes, which split it as the dataset decides; "
            "use num_workers=0 for world-size-invariant batches"
        )
    if refusal is not None:
        return loader, Guarantee(False, f"training batches depend on the world size: {refusal}")
    # An int limit: Lightning fetches no batch ahead, the stream reads ahead itself to see its end in time.
    kind = EndAwareStream if isinstance(limit, int) else GlobalBatchStream
    stream = kind(loader.dataset, per_device_batch_size, world_size, rank, accumulation)
    times = f" x accumulation {accumulation}" if accumulation > 1 else ""
    state = "resumable exactly (state_dict)" if is_stateful(loader.dataset) else "re-read from its start on resume"
    detail = (
        f"a stream cut into global batches of {stream.samples_per_micro_step * accumulation} "
        f"({per_device_batch_size} per process x {world_size}{times}) in stream order, each process training on its "
        f"own slice of each, the same at any world size; {state}"
    )
    kept = stream_limit(limit, stream.samples_per_micro_step)
    if kept.batches is not None:
        detail += f"; {kept.describe()}"
    return rebuild_loader(loader, None, per_device_batch_size, stream), Guarantee(True, detail, kept)


def install_eval_sampler(
    loader: Any, world_size: int, rank: int, stage: str, limit: int | float | None = 1.0
) -> tuple[Any, Guarantee]:
    """An evaluation loader whose ranks take contiguous, unpadded shards, or ``loader`` unchanged and why.

    ``limit``: the ``stage``'s ``limit_*_batches``, kept in the shards (``None``: the Trainer's, per process).
    """
    setting = SETTINGS[stage]
    if (refusal := _refusal(loader)) is not None:
        detail = f"{stage} may count samples twice or out of order: {refusal}"
        if not is_whole(limit):
            detail += f"; {setting} counts each process's own batches"
        return loader, Guarantee(False, detail)
    size = len(loader.dataset)
    kept = evaluation_limit(setting, 1.0 if limit is None else limit, size, loader.batch_size, world_size)
    sampler = EvalShardSampler(loader.dataset, num_replicas=world_size, rank=rank, num_samples=kept.samples)
    if kept.samples == size:
        detail = f"each of the {size} samples once, in dataset order, over {world_size} process(es)"
    else:
        detail = f"the first {kept.samples} of the {size} samples ({setting}={limit}: {kept.batches} batches of "
        detail += f"{kept.batch_size}) once each, in dataset order, over {world_size} process(es)"
    if limit is None:
        detail += f"; {setting} counts each process's own batches (another loader of this stage is not the layer's)"
    guarantee = Guarantee(True, detail, kept if limit is not None else None)
    return rebuild_loader(loader, sampler, loader.batch_size), guarantee


def refuse_several_training_loaders(loader: Any, dp_size: int) -> None:
    """Refuse several training loaders (CombinedLoader...) on several dp ranks: each would grow with the world size."""
    from lightning.pytorch.utilities import CombinedLoader

    if dp_size > 1 and isinstance(loader, (CombinedLoader, dict, list, tuple)):
        raise UserError(
            f"data: the training loader is a {type(loader).__name__} of several loaders, which the template cannot "
            f"split into the same global batches over {dp_size} data-parallel processes (every rank would train on "
            "each loader's whole batches); return one DataLoader over a dataset that yields the combined samples, "
            "or train on one process"
        )
