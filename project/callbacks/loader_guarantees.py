"""Installs the parallel layer's samplers on whatever loaders the datamodule (or the module) returns.

Lightning has no public hook that transforms a datamodule's loaders, so this wraps its ``*_dataloader`` hooks on the
instance. At ``setup`` it builds the training loader once and resolves the plan with its batch size, refusing what
cannot work before anything is trained. It records the epoch's position, so a mid-epoch resume skips exactly the
global batches already trained on (``limit_*_batches``: :mod:`project.parallel.limits`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import RandomSampler, SequentialSampler

from project.callbacks.resume_position import check_resumable
from project.parallel.ddp import evaluation_sampler, training_sampler
from project.parallel.limits import TrainerLimits, refuse_unreachable_validation
from project.parallel.sampler_install import Guarantee, rebuild_loader, takes_eval_sampler
from project.parallel.samplers import GlobalBatchSampler
from project.parallel.stream import GlobalBatchStream, is_stateful
from project.run_state import RunState

EVAL_HOOKS = {"val_dataloader": "validation", "test_dataloader": "test", "predict_dataloader": "predict"}


def _each(loaders: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to one loader or to each of a list/tuple/dict of loaders (several val sets)."""
    if isinstance(loaders, dict):
        return {key: fn(value) for key, value in loaders.items()}
    if isinstance(loaders, (list, tuple)):
        return type(loaders)(fn(value) for value in loaders)
    return fn(loaders)


def _listed(loaders: Any) -> list[Any]:
    """The loaders of one, or of a list/tuple/dict of them."""
    found: list[Any] = []
    _each(loaders, found.append)
    return found


class LoaderGuaranteesCallback(L.Callback):
    """World-size-invariant training batches and exactly-once, ordered evaluation for any datamodule.

    ``run_seed`` seeds a loader without a generator; ``resuming``: this callback's state in the starting checkpoint.
    """

    def __init__(self, state: RunState, run_seed: int = 0, resuming: dict[str, Any] | None = None) -> None:
        self.state, self.run_seed, self.resuming = state, run_seed, resuming
        self._wrapped: set[int] = set()
        self._built_train: Any = None
        self._sampler: GlobalBatchSampler | None = None
        self._stream: GlobalBatchStream | None = None
        self._stream_resume: tuple[int, int] | None = None
        self._stream_state: Any = None
        self._train_limit: int | float = 1.0  # limit_train_batches
        self._resume_point: tuple[int, int] | None = None
        self._position = (0, 0)  # (epoch, batches trained in it)
        self._said: set[str] = set()
        self._limits = TrainerLimits()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the loader hooks once; for fit, build the training loader now and resolve the plan with it."""
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        if id(source) not in self._wrapped:
            self._wrapped.add(id(source))
            for hook in ("train_dataloader", *EVAL_HOOKS):
                if is_overridden(hook, source):
                    setattr(source, hook, self._wrap(hook, getattr(source, hook), trainer))
        if stage == "fit" and is_overridden("train_dataloader", source):
            loader = source.train_dataloader()
            # A loader the layer left alone is built again by Lightning, which records its arguments then.
            self._built_train = loader if self.state.guarantees["training"]["held"] else None
            check_resumable(self.resuming, self.state.plan)
            if self._sampler is not None:  # map-style: the epoch's global batches are known now
                refuse_unreachable_validation(trainer, self._sampler.num_global_batches)
        else:
            self.state.evaluating()

    def _wrap(self, hook: str, original: Callable[[], Any], trainer: L.Trainer) -> Callable[[], Any]:
        def train_dataloader() -> Any:
            if self._built_train is not None:  # built at setup: hand Lightning that one
                loader, self._built_train = self._built_train, None
                return loader
            return self._training(original(), trainer)

        def eval_dataloader() -> Any:
            stage = EVAL_HOOKS[hook]
            loaders, limit = original(), self._limits.user_value(trainer, stage)
            # A fraction is lifted for all the stage's loaders at once: only when each takes the layer's sampler.
            exact = isinstance(limit, int) or all(takes_eval_sampler(loader) for loader in _listed(loaders))
            loaders = _each(loaders, lambda loader: self._evaluation(loader, trainer, stage, limit if exact else None))
            if exact:
                self._limits.lift(trainer, stage)
            return loaders

        return train_dataloader if hook == "train_dataloader" else eval_dataloader

    def training_loader(self) -> tuple[Any, GlobalBatchSampler] | None:
        """The training loader built at ``setup`` and its sampler, while Lightning has not taken it (map-style data)."""
        return (self._built_train, self._sampler) if self._built_train is not None and self._sampler else None

    def _training(self, loader: Any, trainer: L.Trainer) -> Any:
        plan = self.state.with_data_batch(getattr(loader, "batch_size", None))  # the micro-batch picked so far kept
        self._train_limit = limit = trainer.limit_train_batches
        if getattr(trainer, "overfit_batches", 0) and isinstance(getattr(loader, "sampler", None), RandomSampler):
            loader = rebuild_loader(loader, SequentialSampler(loader.dataset), loader.batch_size)  # as Lightning does
        loader, guarantee = training_sampler(loader, plan, trainer.global_rank, self.run_seed, limit)
        if guarantee.held:
            # Lightning warns that a plain DataLoader cannot resume mid-epoch; this sampler does it itself.
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
            if isinstance(loader.dataset, GlobalBatchStream):
                self._stream = loader.dataset
                self._resume_stream()
            else:
                self._sampler = loader.sampler
                self._sampler.resume_point = self._resume_point
        self._record("training", guarantee, trainer)
        return loader

    def _evaluation(self, loader: Any, trainer: L.Trainer, stage: str, limit: int | float | None) -> Any:
        plan = self.state.plan or self.state.built
        assert plan is not None, "a run without a parallel section installs no loaders"
        loader, guarantee = evaluation_sampler(loader, plan, trainer.global_rank, stage, limit)
        self._record(stage, guarantee, trainer)
        return loader

    def _record(self, stage: str, guarantee: Guarantee, trainer: L.Trainer) -> None:
        self.state.guarantees[stage] = guarantee.to_dict()
        if not guarantee.held and trainer.world_size > 1 and stage not in self._said and trainer.is_global_zero:
            self._said.add(stage)
            sys.stderr.write(f"warning: {guarantee.detail}\n")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A new epoch: nothing of it trained yet."""
        self._position = (trainer.current_epoch, 0)
        self._limits.at_epoch_start(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        """The first batch of an epoch resumed mid-way: its GradientAccumulationScheduler factor, which Lightning skips.

        Lightning calls no ``on_train_epoch_start`` when it restarts mid-epoch, where the scheduler sets the factor:
        the resumed epoch would step after every batch (found by the conformance lane).
        """
        if self._resume_point is not None and self._resume_point[1] > 0:
            for scheduler in (c for c in trainer.callbacks if isinstance(c, GradientAccumulationScheduler)):
                trainer.accumulate_grad_batches = scheduler.get_accumulate_grad_batches(trainer.current_epoch)
        self._resume_point = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the batch (``batch_idx`` goes on from the resume point in a resumed epoch)."""
        self._position = (trainer.current_epoch, batch_idx + 1)
        if self._stream is not None and self._stream.exhausted:  # its last batch: its length is known now
            self._limits.at_stream_end(trainer, batch_idx, self._stream.samples_per_micro_step)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The user's limits back on the Trainer: a later run of it reads them afresh."""
        self._limits.restore(trainer)

    def state_dict(self) -> dict[str, Any]:
        """How far into the epoch training got (in global micro-batches), and how large they were."""
        epoch, done = self._position
        state: dict[str, Any] = {"epoch": epoch, "batches_done": done}
        if plan := self.state.plan:
            state.update(global_batch_size=plan.global_batch_size, accumulation=plan.loader_batches[1])
        if (stream := self._stream) is not None:
            # An epoch cut by an int limit_train_batches is over too: the next one reads the stream from its start.
            limit = self._train_limit if isinstance(self._train_limit, int) else float("inf")
            state.update(stream_state=stream.epoch_state, stream_exhausted=stream.exhausted or done >= limit)
        return state

    def _resume_stream(self) -> None:
        """The next pass over the training stream skips what the checkpoint's epoch trained on (once both are known)."""
        if self._stream is None or self._stream_resume is None:
            return
        (epoch, done), self._stream_resume = self._stream_resume, None
        self._stream.skip_batches = done
        user_stream = self._stream.stream
        if is_stateful(user_stream) and self._stream_state is not None:
            user_stream.load_state_dict(self._stream_state)
        elif rank_zero_only.rank == 0:
            sys.stderr.write(
                f"warning: resuming epoch {epoch} of the training stream {type(user_stream).__name__}, which has no "
                f"state_dict/load_state_dict: its first {done * self._stream.samples_per_micro_step} samples are read "
                "again and skipped, which is exact only if it yields the same samples every time it is iterated\n"
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume mid-epoch after the global batches already trained on (the same number at any world size)."""
        if "epoch" in state_dict:
            self._position = self._resume_point = (int(state_dict["epoch"]), int(state_dict["batches_done"]))
            if not state_dict.get("stream_exhausted", True):  # saved mid-epoch by a run reading a stream
                self._stream_resume, self._stream_state = self._resume_point, state_dict.get("stream_state")
                self._resume_stream()
            if self._sampler is not None:  # built at setup, before Lightning restored this state
                self._sampler.resume_point = self._resume_point
