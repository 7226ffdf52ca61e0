"""Write what ``predict_step`` returns to ``<run>/predictions.csv``: one row per sample, in dataset order, once each.

The layer's ``callbacks`` hook (:func:`prediction_callbacks`) gives every ``predict`` this writer, unless the config
lists a prediction writer of its own in ``trainer.callbacks`` (any
:class:`~lightning.pytorch.callbacks.BasePredictionWriter`, this one included).

Rows are in dataset order, one per sample: the first column, ``index``, is the sample's index in the
predict dataset (as the sampler drew it; a stream's rows are numbered as they came). Then the prediction,
by what ``predict_step`` returns for a batch of ``n`` samples:

- a tensor (or NumPy array) whose first dimension is the ``n`` samples: one column ``prediction``;
- a list of ``n`` plain values (strings, numbers, 0-dim tensors): one column ``prediction``;
- a tuple or list of those: one column per position, ``prediction_0``, ``prediction_1``, ...;
- a dict of those: one column per key (``index,probs,label``); a tuple in it gives ``key_0``, ``key_1``,
  a dict in it ``key.sub``.

A cell is a number or a string as it is; a vector per sample (probabilities, several regression targets)
is one quoted JSON list, so a row keeps one cell per column (``3,"[0.1, 0.7, 0.2]"``). With several
predict loaders a first column ``dataloader`` says which one, and ``index`` counts within it.

What cannot be split into one value per sample (one number for the whole batch, a list whose length is
not the batch's) stops ``predict`` with one ``error:`` line naming what was returned, before anything is
written. A ``predict_step`` that returns ``None`` for every batch writes nothing and says so.

This module collects the rows on every rank and writes them on rank 0; splitting one batch's output into rows
and the CSV text are :mod:`project.extras.predictions.rows`.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

from project.checkpoints.atomic import atomic_write_text
from project.errors import UserError
from project.extras.predictions.rows import Unsplittable, describe, prediction_csv, prediction_table
from project.parallel.collectives import in_process_group
from project.parallel.samplers import EvalShardSampler
from project.parallel.strategies import layout_of
from project.runs import run_directory

#: What ``predict_step`` may return per batch, for the error that says it returned something else.
EXPECTED = (
    "one value per sample (a tensor whose first dimension is the batch, a list with one entry per sample, or a "
    "tuple/list/dict of those), or list a prediction writer of your own in trainer.callbacks"
)


def _sample_indices(batch_indices: Sequence[Any] | None) -> list[int] | None:
    """The dataset indices of a batch's samples, as the sampler drew them (Lightning records them), if known."""
    try:
        # An IterableDataset's are all None, and a sampler of the user's may yield anything.
        return [operator.index(i) for i in batch_indices] if batch_indices else None
    except TypeError:
        return None


def _batch_size(batch: Any) -> int | None:
    """The samples in a batch whose indices are unknown: its tensors' first dimension, if it has tensors."""
    try:
        return extract_batch_size(batch)
    except Exception:  # a batch of strings, say: the output's own length decides
        return None


def _ordered_shards(loader: Any) -> bool:
    """Whether ``loader`` samples with the layer's ordered shards (Lightning wraps predict's batch sampler)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    samplers = (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    return any(isinstance(sampler, EvalShardSampler) for sampler in samplers)


def lists_prediction_writer(callbacks: Any) -> bool:
    """Whether ``trainer.callbacks`` (one callback, a list, or ``None``) has a prediction writer of its own."""
    listed = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    return any(isinstance(callback, BasePredictionWriter) for callback in listed)


class PredictionsWriter(BasePredictionWriter):
    """Collect each rank's predictions, one row per sample, and let rank 0 write them to the run directory.

    The parallel layer gives each rank one contiguous, unpadded shard
    (:class:`~project.parallel.samplers.EvalShardSampler`), so the ranks' rows together are each sample
    once; each row keeps its sample's index (Lightning records what the sampler drew), and rank 0 writes
    them sorted by it. A multi-process ``predict`` over a loader without the layer's shards is refused.

    Every batch is split into rows as it comes: on one process an output that cannot be split stops
    ``predict`` at once; on several, every rank goes on to the end of its shard and all stop together with
    the first rank's error (a rank that stopped alone would leave the others waiting in the gather).

    Args:
        filename: Name of the CSV file inside the run directory.
    """

    def __init__(self, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")  # Lightning then hands each batch its sample indices
        self.filename = filename
        #: Where the last predictions went (rank 0).
        self.path: Path | None = None
        self._skip: str | None = None
        self._last_indices: Any = None
        self._reset()

    def _reset(self) -> None:
        self._names: list[str] | None = None
        self._rows: dict[int, list[tuple[int | None, list[Any]]]] = {}  # loader -> (sample index, cells)
        self._none = 0  # batches for which predict_step returned None
        self._error: str | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write nothing for a ``predict_step(dataloader_iter)``: it does not say which samples a step predicted."""
        # Lightning's own writer refuses it with NotImplementedError: a writer every predict gets must not.
        takes_iterator = is_param_in_hook_signature(pl_module.predict_step, "dataloader_iter", explicit=True)
        self._skip = "predict_step takes dataloader_iter" if takes_iterator else None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse, before predicting, several processes whose shards would not give the dataset order."""
        if self._skip is not None:
            if trainer.is_global_zero:
                sys.stderr.write(f"warning: {self._skip}: no {self.filename} written\n")
            return
        if trainer.world_size == 1:
            return
        loaders = trainer.predict_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        if not all(_ordered_shards(loader) for loader in loaders):
            raise UserError(
                f"predict on {trainer.world_size} processes: the predict loader's samples cannot be put in "
                "dataset order (see plan.json guarantees.predict); run predict on one process"
            )

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start a fresh collection."""
        self._reset()

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Split this batch's output into rows (cells on the CPU); an output that cannot be split is refused."""
        if self._skip is not None or self._error is not None:
            return
        try:
            # Lightning leaves the last batch's indices in place for a loader it cannot index: not this batch's.
            fresh = batch_indices is not self._last_indices
            self._last_indices = batch_indices
            self._keep(prediction, _sample_indices(batch_indices) if fresh else None, batch, dataloader_idx)
        except Unsplittable as error:
            message = (
                f"predict_step returned {describe(prediction)} for batch {batch_idx}, which cannot be written "
                f"as one row per sample: {error}; {self.filename} needs {EXPECTED}"
            )
            if trainer.world_size == 1:
                raise Unsplittable(message) from None
            self._error = f"rank {trainer.global_rank}: {message}"

    def _keep(self, prediction: Any, indices: list[int] | None, batch: Any, dataloader_idx: int) -> None:
        if prediction is None:
            self._none += 1
        else:
            names, rows = prediction_table(prediction, len(indices) if indices else _batch_size(batch))
            if self._names is not None and names != self._names:
                raise Unsplittable(f"its columns {names} are not the earlier batches' {self._names}")
            self._names = names
            self._rows.setdefault(dataloader_idx, []).extend(zip(indices or [None] * len(rows), rows, strict=True))
        if self._none and self._names is not None:
            raise Unsplittable("None for some batches and values for others")

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Gather every rank's rows (uneven shards: gathered as objects) and write them on rank 0."""
        if self._skip is not None:
            return
        local = (self._error, self._names, self._rows, self._none)
        parts = [local]
        if trainer.world_size > 1 and in_process_group():
            parts = [None] * trainer.world_size
            dist.all_gather_object(parts, local)
        # Every rank decides from the same gathered parts: all raise, return or write together.
        errors = [error for error, *_ in parts if error is not None]
        if errors:
            raise Unsplittable(errors[0])
        names = [part_names for _, part_names, _, _ in parts if part_names is not None]
        if any(other != names[0] for other in names):
            raise Unsplittable(f"predict_step returned the columns {names[0]} on one rank and {names[-1]} on another")
        nones = sum(none for *_, none in parts)
        if names and nones:
            raise Unsplittable("predict_step returned None for some batches and values for others")
        if not names:
            if trainer.is_global_zero:
                said = "predict_step returned None for every batch" if nones else "predict had no samples"
                sys.stderr.write(f"warning: {said}: no {self.filename} written\n")
            return
        log_dir = run_directory(trainer)  # a collective: every rank asks
        if not trainer.is_global_zero or log_dir is None:
            return
        if len(parts) > 1:  # a pipeline's stages predicted the same rows (they share their data): the first's only
            layout = layout_of(trainer)
            parts = [part for rank, part in enumerate(parts) if layout.pp_rank(rank) == 0]
        loaders = {
            k: [row for _, _, rows, _ in parts for row in rows.get(k, [])] for k in set().union(*(p[2] for p in parts))
        }
        self.path = Path(log_dir) / self.filename
        atomic_write_text(self.path, prediction_csv(names[0], loaders, several=len(trainer.num_predict_batches) > 1))
