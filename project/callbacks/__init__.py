"""Callbacks: the seed's barrier, its ``model.module`` unwrapping for evaluation and export, and the run's records.

Two kinds, each installed one way:

- chosen in the config (``trainer.callbacks``): :class:`BarrierCallback`, :class:`UnwrapEvalCallback`,
  a prediction writer, and any progress bar;
- the template's own, on every run, from :func:`template_callbacks`: the loader guarantees, ``plan.json``,
  every rank's random state, the monitored-metric check, the unused-parameter check (DDP), and
  :class:`ProgressBar` unless the config names a progress bar or turns it off;
- each layer's (project/extras/), which the builder adds after these.
"""

from __future__ import annotations

from lightning import Callback

from project.callbacks.barrier import BarrierCallback
from project.callbacks.best_checkpoint import BestCheckpoint
from project.callbacks.checks import MonitoredMetricsCheck
from project.callbacks.loader_guarantees import LoaderGuaranteesCallback
from project.callbacks.model_checks import UnusedParametersCheck
from project.callbacks.preemption import StopOnSignal
from project.callbacks.progress import ProgressBar
from project.callbacks.rng import RandomStateCallback
from project.callbacks.run_record import RunRecordCallback
from project.callbacks.timed_checkpoint import TimedCheckpoint
from project.callbacks.unwrap import UnwrapEvalCallback
from project.run_state import RunState

__all__ = [
    "BarrierCallback",
    "BestCheckpoint",
    "LoaderGuaranteesCallback",
    "MonitoredMetricsCheck",
    "ProgressBar",
    "RandomStateCallback",
    "RunRecordCallback",
    "StopOnSignal",
    "TimedCheckpoint",
    "UnusedParametersCheck",
    "UnwrapEvalCallback",
    "template_callbacks",
]


def template_callbacks(
    state: RunState,
    loaders: LoaderGuaranteesCallback | None,
    ckpt_path: str | None,
    progress_bar: bool,
    stop: StopOnSignal | None = None,
) -> list[Callback]:
    """The callbacks every run gets, in the order they must run (the loaders before the record of them).

    Args:
        state: The run's state, which the builder made: handed to each callback that reads the plan.
        loaders: The parallel layer's loader callback; ``None`` with ``parallel: null`` (plain Lightning).
        ckpt_path: The checkpoint this process starts from, for the same-checkpoint-on-every-rank check.
        progress_bar: Add :class:`ProgressBar` (Lightning's rich bar, redrawn at most 10 times a second).
        stop: The stop on a signal (``fit``): every rank stops at the same step and saves it.
    """
    own: list[Callback] = [loaders] if loaders is not None else []
    own += [RunRecordCallback(state), RandomStateCallback(ckpt_path), MonitoredMetricsCheck()]
    own.append(UnusedParametersCheck())  # DDP: parameters that got no gradient, named before the first step
    own += [stop] if stop is not None else []
    return [*own, ProgressBar()] if progress_bar else own
