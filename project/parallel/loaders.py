"""The parallel layer's guarantees, installed on the loaders of any datamodule.

Training: the loader's sampler is replaced by :class:`~project.parallel.sampling.GlobalBatchSampler` at the
plan's per-device batch size, so the global batches do not depend on the world size. Evaluation and
prediction: by :class:`~project.parallel.sampling.EvalShardSampler`, so every sample counts once and the
ranks' shards, in rank order, are the dataset order. Everything else of the user's loader stays: dataset,
collate_fn, workers, pinning, worker_init_fn, generator.

A training stream (an ``IterableDataset``) is cut into the same global batches by
:class:`~project.parallel.stream.GlobalBatchStream`. Where that cannot be done without changing what the user's
loader means (an evaluation stream, a custom sampler or batch_sampler, a DataLoader subclass), the loader is
left alone and the :class:`Guarantee` says why; the run says so in one line before training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from project.data.augment import SeededAugmentation
from project.parallel.sampling import EvalShardSampler, GlobalBatchSampler
from project.parallel.stream import GlobalBatchStream, is_stateful


@dataclass(frozen=True)
class Guarantee:
    """Whether a loader got the layer's sampler, and what that means (or why not)."""

    held: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``plan.json``."""
        return {"held": self.held, "detail": self.detail}


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
    sampler = loader.sampler
    if isinstance(sampler, (GlobalBatchSampler, EvalShardSampler, SequentialSampler)):
        return None
    if type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(loader.dataset):
        return None
    return f"the loader has a custom sampler ({type(sampler).__name__})"


def _rebuild(loader: DataLoader, sampler: Any, batch_size: int, dataset: Any = None) -> DataLoader:
    """``loader`` again with ``sampler`` and ``batch_size`` (and ``dataset``); every other setting kept."""
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


def shuffle_seed(loader: DataLoader, run_seed: int) -> int:
    """The seed of the training permutation: the loader's own generator's, else the run's seed."""
    return int(loader.generator.initial_seed()) if loader.generator is not None else run_seed


def install_training_sampler(
    loader: Any, per_device_batch_size: int, world_size: int, rank: int, run_seed: int, accumulation: int = 1
) -> tuple[Any, Guarantee]:
    """The training loader with world-size-invariant global batches, or ``loader`` unchanged and why.

    Raises:
        ValueError: the dataset holds fewer samples than one global batch.
    """
    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return _install_stream(loader, per_device_batch_size, world_size, rank, accumulation)
    refusal = _refusal(loader)
    if refusal is not None:
        return loader, Guarantee(False, f"training batches depend on the world size: {refusal}")
    shuffle = not isinstance(loader.sampler, SequentialSampler)
    if isinstance(loader.sampler, GlobalBatchSampler):
        shuffle = loader.sampler.shuffle
    sampler = GlobalBatchSampler(
        loader.dataset,
        per_device_batch_size,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=shuffle_seed(loader, run_seed),
        accumulation=accumulation,
        with_epoch=isinstance(loader.dataset, SeededAugmentation),
    )
    times = f" x accumulation {accumulation}" if accumulation > 1 else ""
    detail = (
        f"global batches of {sampler.global_batch_size * accumulation} "
        f"({per_device_batch_size} per process x {world_size}{times}), "
        f"{'shuffled' if shuffle else 'in order'} with seed {sampler.seed}, the same at any world size"
    )
    return _rebuild(loader, sampler, per_device_batch_size), Guarantee(True, detail)


def _install_stream(
    loader: Any, per_device_batch_size: int, world_size: int, rank: int, accumulation: int
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
    stream = GlobalBatchStream(loader.dataset, per_device_batch_size, world_size, rank, accumulation)
    times = f" x accumulation {accumulation}" if accumulation > 1 else ""
    state = "resumable exactly (state_dict)" if is_stateful(loader.dataset) else "re-read from its start on resume"
    detail = (
        f"a stream cut into global batches of {stream.samples_per_micro_step * accumulation} "
        f"({per_device_batch_size} per process x {world_size}{times}) in stream order, each process training on its "
        f"own slice of each, the same at any world size; {state}"
    )
    return _rebuild(loader, None, per_device_batch_size, stream), Guarantee(True, detail)


def install_eval_sampler(loader: Any, world_size: int, rank: int, stage: str) -> tuple[Any, Guarantee]:
    """An evaluation loader whose ranks take contiguous, unpadded shards, or ``loader`` unchanged and why."""
    refusal = _refusal(loader)
    if refusal is not None:
        return loader, Guarantee(False, f"{stage} may count samples twice or out of order: {refusal}")
    sampler = EvalShardSampler(loader.dataset, num_replicas=world_size, rank=rank)
    detail = f"each of the {len(loader.dataset)} samples once, in dataset order, over {world_size} process(es)"
    return _rebuild(loader, sampler, loader.batch_size), Guarantee(True, detail)
