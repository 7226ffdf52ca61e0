"""What the Trainer's ``limit_*_batches`` mean under the parallel layer: the same samples at any world size.

Lightning counts a limit in each process's own batches. Here evaluation's is read as on one process, in samples
(an int ``N``: the first ``N x batch_size``; a fraction: its first whole batches) that EvalShardSampler shards, and
the Trainer's own cuts nothing more (a fraction is lifted to 1.0: :class:`TrainerLimits`). Training's batches are
global already (one per process per global batch), so Lightning's count is the global one at any world size.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from project.errors import UserError
from project.parallel.stream import GlobalBatchStream

#: The Trainer setting that limits each stage's batches.
SETTINGS = {
    "training": "limit_train_batches",
    "validation": "limit_val_batches",
    "test": "limit_test_batches",
    "predict": "limit_predict_batches",
}


@dataclass(frozen=True)
class Limit:
    """The samples one ``limit_*_batches`` keeps (training: in global micro-batches; ``None``: all of a stream)."""

    setting: str  # limit_val_batches, ...
    value: int | float  # what the user set: an int number of batches, or a fraction
    batches: int | None  # batches kept
    batch_size: int
    samples: int | None  # samples kept
    total: int | None  # samples there are (training: an epoch's whole global batches)
    shards: tuple[int, ...] = ()  # samples of each process (evaluation)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``plan.json`` and ``plan``."""
        data = {"setting": self.setting, "value": self.value, "batches": self.batches, "batch_size": self.batch_size}
        data.update(samples=self.samples, of=self.total)
        return {**data, "per_process": list(self.shards)} if self.shards else data

    def describe(self) -> str:
        """One phrase: what the limit keeps, in samples."""
        head, kept, size = f"{self.setting}={self.value}", self.batches, self.batch_size
        if self.setting != SETTINGS["training"]:
            which = "all" if self.samples == self.total else f"the first {self.samples} of"
            shards = f", {' + '.join(map(str, self.shards))} per process" if len(self.shards) > 1 else ""
            return f"{head}: {which} {self.total} samples ({kept} batches of {size}{shards})"
        if kept is None:
            return f"{head}: the whole stream, in global batches of {size}"
        if self.total is None:
            return f"{head}: at most {kept} global batches of {size} ({self.samples} samples)"
        if self.samples == self.total:
            return f"{head}: all {kept} global batches of {size} ({self.total} samples) an epoch"
        return f"{head}: {kept} global batches of {size} = {self.samples} of the {self.total} samples of an epoch"


def is_whole(value: int | float | None) -> bool:
    """Whether a limit keeps everything (the float 1.0; the int 1 is one batch)."""
    return isinstance(value, float) and value == 1.0


def kept_batches(setting: str, value: int | float, batches: int) -> int:
    """The batches a limit keeps of ``batches``, as Lightning counts them on one process (less than one: refused)."""
    if isinstance(value, int):
        return min(batches, value)
    kept = int(batches * value)
    if kept == 0 and value > 0 and batches > 0:
        raise UserError(
            f"trainer.{setting}={value} of {batches} batches is less than one batch; use at least "
            f"{1 / batches:.4g}, or an int number of batches"
        )
    return kept


def shard_sizes(samples: int, world_size: int) -> tuple[int, ...]:
    """Samples of each rank's contiguous shard (the first ranks take one more), as EvalShardSampler cuts them."""
    size, extra = divmod(samples, world_size)
    return tuple(size + (1 if rank < extra else 0) for rank in range(world_size))


def evaluation_limit(setting: str, value: int | float, dataset_size: int, batch_size: int, world_size: int) -> Limit:
    """The dataset's first samples that ``value`` keeps, in whole batches of ``batch_size``, sharded over the ranks."""
    kept = kept_batches(setting, value, math.ceil(dataset_size / batch_size))
    samples = min(dataset_size, kept * batch_size)
    return Limit(setting, value, kept, batch_size, samples, dataset_size, shard_sizes(samples, world_size))


def training_limit(value: int | float, global_batches: int, samples_per_micro_step: int) -> Limit:
    """The global (micro-)batches of an epoch that ``limit_train_batches`` keeps (map-style data)."""
    kept, total = kept_batches(SETTINGS["training"], value, global_batches), global_batches * samples_per_micro_step
    return Limit(SETTINGS["training"], value, kept, samples_per_micro_step, kept * samples_per_micro_step, total)


def stream_limit(value: int | float, samples_per_micro_step: int) -> Limit:
    """``limit_train_batches`` for a training stream: an int number of global batches, or the whole stream (1.0)."""
    setting = SETTINGS["training"]
    if isinstance(value, float) and value != 1.0:
        raise UserError(
            f"trainer.{setting}={value} is a fraction of a training stream (an IterableDataset), whose length is "
            "unknown until it ends; use an int number of global batches, or 1.0"
        )
    if isinstance(value, float):
        return Limit(setting, value, None, samples_per_micro_step, None, None)
    return Limit(setting, value, value, samples_per_micro_step, value * samples_per_micro_step, None)


class EndAwareStream(GlobalBatchStream):
    """A :class:`~project.parallel.stream.GlobalBatchStream` that reads one sample ahead of the loader.

    With an int ``limit_train_batches`` Lightning fetches no batch ahead: ``exhausted`` is set while the last batch is
    fetched, before validation is decided (a checkpoint still sees the stream unfinished).
    """

    def __iter__(self) -> Iterator[Any]:
        """This rank's samples, as the parent yields them."""
        samples, end = super().__iter__(), object()
        ahead = next(samples, end)
        while ahead is not end:
            current, ahead = ahead, next(samples, end)
            yield current


def refuse_unreachable_validation(trainer: Any, global_batches: int) -> None:
    """Refuse an int ``val_check_interval`` beyond an epoch's ``global_batches`` (Lightning: after the sanity check)."""
    interval = trainer.val_check_interval
    if not isinstance(interval, int) or isinstance(interval, bool):
        return
    train = kept_batches(SETTINGS["training"], trainer.limit_train_batches, global_batches)
    if trainer.check_val_every_n_epoch is None or not trainer.limit_val_batches or interval <= train:
        return
    limit = trainer.limit_train_batches
    cut = "" if is_whole(limit) else f" (limit_train_batches={limit} of its {global_batches} global batches)"
    raise UserError(
        f"trainer.val_check_interval={interval} is more than the {train} training batches of an epoch{cut}: "
        f"validation and the best checkpoint would never run; set it to {train} or less, or "
        "check_val_every_n_epoch: null to count batches across epochs"
    )


class TrainerLimits:
    """The user's ``limit_*_batches``, read once per stage, and the Trainer's per-process limits the layer lifts."""

    def __init__(self) -> None:
        self._user: dict[str, int | float] = {}
        self._val_check_batch: Any = None  # Lightning's own, while the end of a stream brings validation forward
        self._said = False

    def user_value(self, trainer: Any, stage: str) -> int | float:
        """The limit the user set for ``stage`` (read before the layer lifts the Trainer's)."""
        return self._user.setdefault(SETTINGS[stage], getattr(trainer, SETTINGS[stage]))

    def lift(self, trainer: Any, stage: str) -> None:
        """Let the Trainer cut nothing of the shards the layer narrowed already (an int cannot cut them)."""
        if isinstance(value := self.user_value(trainer, stage), float) and value > 0:
            setattr(trainer, SETTINGS[stage], 1.0)

    def restore(self, trainer: Any) -> None:
        """The user's limits back on the Trainer (at teardown: the next run of it reads them afresh)."""
        for setting, value in self._user.items():
            setattr(trainer, setting, value)
        self._user.clear()

    def at_epoch_start(self, trainer: Any) -> None:
        """Lightning's validation schedule back, if the previous epoch's stream end brought it forward."""
        if self._val_check_batch is not None:
            trainer.val_check_batch, self._val_check_batch = self._val_check_batch, None

    def at_stream_end(self, trainer: Any, batch_idx: int, samples_per_micro_step: int) -> None:
        """The training stream ended with batch ``batch_idx``: validate now if it was due later (else it never is)."""
        due, every, batches = trainer.val_check_batch, trainer.check_val_every_n_epoch, batch_idx + 1
        early = isinstance(due, int) and batches < due and every is not None and trainer.enable_validation
        if not early or (trainer.current_epoch + 1) % every:
            return
        if self._val_check_batch is None:
            self._val_check_batch = due
        trainer.val_check_batch = batches  # Lightning validates when (batch_idx + 1) % val_check_batch == 0
        if self._said or not trainer.is_global_zero:
            return
        self._said = True
        # An int val_check_interval is the count itself; otherwise the limit set it (a fraction of the limit).
        name = "val_check_interval" if isinstance(trainer.val_check_interval, int) else "limit_train_batches"
        sys.stderr.write(
            f"warning: the training stream ended after {batches} global batches ({batches * samples_per_micro_step} "
            f"samples) in epoch {trainer.current_epoch}, before validation was due (batch {due}, "
            f"trainer.{name}={getattr(trainer, name)}): it would never run, so it runs at the stream's end "
            f"instead; set --trainer.{name} {batches} or less\n"
        )
