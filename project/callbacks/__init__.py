"""Callbacks: the seed's barrier and unwrapping, chosen in the config, and the template's own on every run."""

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
    """The callbacks every run gets, in the order they must run (the loaders before the record of them)."""
    own = [loaders, RunRecordCallback(state), RandomStateCallback(ckpt_path), MonitoredMetricsCheck()]
    own += [UnusedParametersCheck(), stop, ProgressBar() if progress_bar else None]
    return [callback for callback in own if callback is not None]
