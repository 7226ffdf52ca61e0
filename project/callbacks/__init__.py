"""Callbacks: the seed's barrier and ``model.module`` unwrapping (chosen in the config), and the template's own.

:func:`template_callbacks` adds the template's to every run; each layer's (project/extras/) come after them.
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

    ``loaders`` is ``None`` with ``parallel: null``; ``ckpt_path`` is this process's start, which every rank must
    share; ``progress_bar`` adds :class:`ProgressBar` (the config names none and does not turn it off).
    """
    own: list[Callback] = [loaders] if loaders is not None else []
    own += [RunRecordCallback(state), RandomStateCallback(ckpt_path), MonitoredMetricsCheck(), UnusedParametersCheck()]
    own += [stop] if stop is not None else []
    return [*own, ProgressBar()] if progress_bar else own
