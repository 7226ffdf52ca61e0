"""World-size-invariant batching for a stream (an ``IterableDataset``): the same global batches at any world size.

A stream has no indices, so every rank reads all of it and keeps ``[r*b, (r+1)*b)`` of each micro-step of
``b x world_size`` samples, as GlobalBatchSampler does. A mid-epoch resume skips the micro-batches trained on: exactly
with ``state_dict``/``load_state_dict``, else re-read from its start (exact if it yields the same samples again).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset


def is_stateful(stream: Any) -> bool:
    """Whether the stream can save and restore its position (``state_dict`` and ``load_state_dict``)."""
    return callable(getattr(stream, "state_dict", None)) and callable(getattr(stream, "load_state_dict", None))


class GlobalBatchStream(IterableDataset):
    """This rank's ``batch_size`` samples of each global micro-batch of ``stream``, whole optimizer steps only."""

    def __init__(
        self, stream: IterableDataset, batch_size: int, num_replicas: int = 1, rank: int = 0, accumulation: int = 1
    ) -> None:
        if batch_size < 1 or num_replicas < 1 or not 0 <= rank < num_replicas or accumulation < 1:
            raise ValueError(
                f"batch_size={batch_size}, accumulation={accumulation} must be >= 1 and rank={rank} in "
                f"[0, {num_replicas})"
            )
        self.stream, self.batch_size, self.num_replicas, self.rank = stream, batch_size, num_replicas, rank
        self.accumulation = accumulation
        #: Global micro-batches of the next epoch to skip (a mid-epoch resume); used once.
        self.skip_batches = 0
        #: The stream's state when the current epoch started (stateful streams), saved with the checkpoint.
        self.epoch_state: Any = None
        #: Whether the current pass reached the stream's end (a checkpoint then resumes with the next epoch).
        self.exhausted = False

    @property
    def samples_per_micro_step(self) -> int:
        """Samples of one global micro-batch: ``b x world_size``."""
        return self.batch_size * self.num_replicas

    def __iter__(self) -> Iterator[Any]:
        """Yield this rank's samples, ``b`` per global micro-batch, whole optimizer steps only."""
        self.exhausted = False
        if is_stateful(self.stream):
            self.epoch_state = self.stream.state_dict()
        micro, step = self.samples_per_micro_step, self.samples_per_micro_step * self.accumulation
        source = iter(self.stream)
        skip, self.skip_batches = self.skip_batches, 0
        for _ in islice(source, skip * micro):
            pass
        start, end = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        while True:
            chunk = list(islice(source, step))
            if len(chunk) < step:
                self.exhausted = True
                return  # the incomplete last optimizer step, dropped at every world size
            for offset in range(0, step, micro):
                yield from chunk[offset + start : offset + end]
