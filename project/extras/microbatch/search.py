"""``parallel.micro_batch: auto``: the largest micro-batch that fits on every rank, picked at the start of ``fit``.

The plan fixes the global batch; each process trains ``P = global / data-parallel size`` samples per optimizer
step, in micro-batches of ``m``. Only speed and memory depend on ``m``, never the result (the sampler deals the same
global batches, :mod:`project.parallel.samplers`), so the template may choose it: at ``on_fit_start`` (the model is
wrapped and the optimizers exist), it tries ``P``, then the largest divisor of ``P`` at most half of it, and so on
(at most ``log2(P) + 1`` trials), each a real step on real samples whose effects are undone
(:mod:`.trial`); the ranks agree on each verdict, so all keep one size.

Under ``auto`` the training loader hands each process its whole step and the template splits it into micro-batches
itself (:mod:`.split_step`), so that a step that runs out of memory later on any rank is done again, finer, by every
rank. The data position of a checkpoint counts steps, so a resumed run searches afresh. :func:`micro_batch_callbacks`
is the layer's ``callbacks`` hook: the builder adds the search to every Trainer of a run under ``auto``.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from project.callbacks.loader_guarantees import LoaderGuaranteesCallback
from project.errors import RunFailure, UserError
from project.extras.microbatch.plan import AUTO, micro_batch_candidates, picked
from project.extras.microbatch.split_step import SplitStep
from project.extras.microbatch.trial import FAILED, FITS, agree, try_micro_batch
from project.run_state import RunState

_PER_SAMPLE_STATISTICS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


def _fetch(loader: DataLoader, indices: list[Any]) -> Any:
    """The samples at ``indices`` as the loader fetches them (``__getitems__`` where the dataset has it)."""
    getitems = getattr(loader.dataset, "__getitems__", None)
    return getitems(indices) if callable(getitems) else [loader.dataset[index] for index in indices]


def micro_batch_callbacks(state: RunState, row: Any, config: Any) -> list[L.Callback]:
    """The layer's ``callbacks`` hook: the search, for a run whose plan says ``micro_batch: auto``."""
    return [MicroBatchSearch(state)] if state.built is not None and state.built.micro_batch == AUTO else []


class MicroBatchSearch(L.Callback):
    """Pick the micro-batch under ``micro_batch: auto``; hand it to the plan and to the split of each step.

    The trial steps draw from the training loader the template's loader callback built at ``setup``.

    Args:
        state: The run's state: its plan (resolved with the data batch), which the pick changes.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._split: SplitStep | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Try the candidate sizes, largest first, until one fits on every rank."""
        plan = self.state.plan
        if plan is None or plan.micro_batch != AUTO:
            return
        loaders = next((c for c in trainer.callbacks if isinstance(c, LoaderGuaranteesCallback)), None)
        built = loaders.training_loader() if loaders is not None else None
        if built is None or plan.per_device_batch_size is None:
            raise UserError(
                "parallel.micro_batch='auto' needs a map-style training dataset whose loader has a batch_size (the "
                "template deals its global batches); this one has none or is a stream: set parallel.micro_batch "
                "to a number"
            )
        loader, sampler = built
        trials: list[tuple[int, bool]] = []
        candidates = micro_batch_candidates(plan.per_device_batch_size)
        for micro in candidates:
            samples = _fetch(loader, sampler.first_indices(micro))
            batch = trainer.strategy.batch_to_device(loader.collate_fn(samples))
            verdict, error = try_micro_batch(trainer, batch)
            del batch, samples
            agreed = agree(verdict, trainer.strategy.root_device)
            if agreed == FAILED:
                if error is not None:
                    raise error
                raise RunFailure("micro_batch auto: the trial step failed on another rank; its error is above")
            trials.append((micro, agreed == FITS))
            if agreed == FITS:
                break
        else:
            tried = ", ".join(str(size) for size, _ in trials)
            raise RunFailure(
                f"micro_batch auto: no micro-batch fits in memory on every rank (tried {tried} samples per process); "
                "use more processes, a smaller model, or scenario fsdp with a fixed parallel.micro_batch"
            )
        self.state.amend(picked(micro, tuple(trials)))  # the loader keeps whole steps, split later
        self._split = SplitStep(trainer, micro, candidates, plan.per_device_batch_size)
        self._split.install()
        self._say(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The module's own ``training_step`` back (a later ``fit`` searches again)."""
        if self._split is not None:
            self._split.uninstall()
            self._split = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """As at the end of ``fit``."""
        self.on_fit_end(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The micro-batch in use and each time the run split finer (for the record: a resume searches again)."""
        if self._split is None:
            return {}
        return {"micro_batch": self._split.micro, "split_finer": [list(drop) for drop in self._split.drops]}

    def _say(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The pick in one line (rank 0), and a warning where a module normalises each micro-batch."""
        plan = self.state.plan
        assert plan is not None
        if not trainer.is_global_zero:
            return
        sys.stderr.write(f"{plan.notes[0]}\n")
        normalising = [name for name, module in pl_module.named_modules() if isinstance(module, _PER_SAMPLE_STATISTICS)]
        if normalising:
            sys.stderr.write(
                f"warning: micro_batch auto: {', '.join(normalising)} normalise each micro-batch of {plan.micro_batch} "
                "samples, so results depend on the size picked; set parallel.micro_batch to a number to fix it\n"
            )
