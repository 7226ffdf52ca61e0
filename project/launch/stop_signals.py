"""The stop signals of ``fit``, handled by one handler from the first instant of the process to its last.

Never given back: a scheduler signals twice (SLURM's ``--signal``, then SIGTERM), and a default handler put back
during shutdown would end the process by that signal instead of exit code 75. By phase: ``before`` the first step and
``after`` the last (test, export) :class:`StopSignal` ends the rank where it is; in ``training`` the callback's handler
(:class:`project.callbacks.preemption.StopOnSignal`) stops every rank at one agreed step and saves it; ``ending`` and
``done`` only note it. The process ends within ``grace_s`` of its first stop signal (:func:`start_grace`), with 75.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from project.errors import RANK_VARIABLES, Preempted
from project.launch.orphans import finish_without_parent

ENDS_AT_ONCE = ("before", "after")  # a stop signal ends the rank at once: no training would be lost
PHASES = ("before", "training", "after", "ending", "done")
_LEFT = {  # what a rank that stopped in each phase left behind, said by rank 0 (peer_stopped)
    "before": "before the first training step of this run, so nothing was trained and nothing is lost",
    "after": "after the last training step; the checkpoints are kept, the test and export after fit did not run",
}


class StopSignal(BaseException):
    """Ends the rank where it is, outside the training steps (a BaseException: ``except Exception`` lets it by)."""

    def __init__(self, name: str, phase: str) -> None:
        super().__init__(f"{name} {phase}")
        self.name, self.phase = name, phase


@dataclass
class _State:
    signals: tuple[signal.Signals, ...] = ()
    grace_s: float = 20.0
    phase: str = "before"
    first: str | None = None  # the first stop signal this process got
    raised_in: str | None = None  # the phase in which the handler raised StopSignal
    during_training: Callable[[int], None] | None = None
    previous: dict[signal.Signals, Any] = field(default_factory=dict)  # the handlers found, given back by finish()
    owns_process: bool = False  # `python -m project`: the handlers stay until exit (else: given back at the end)
    grace: threading.Thread | None = None
    kept: Callable[[], str] = field(default=lambda: "the newest complete checkpoint is kept")  # said by the grace exit
    undo: Callable[[], None] | None = None  # rank 0: puts the run directory back (an end before the first step)


_STATE = _State()


def install(signals: Iterable[str], grace_s: float) -> None:
    """Handle ``signals`` as stop signals from now on (others named before get theirs back); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    wanted = tuple(signal.Signals[name] for name in signals)
    for signum in set(_STATE.signals) - set(wanted):
        signal.signal(signum, _STATE.previous.pop(signum, signal.SIG_DFL))
    for signum in set(wanted) - set(_STATE.signals):
        _STATE.previous[signum] = signal.getsignal(signum)
    _STATE.signals, _STATE.grace_s = wanted, grace_s
    reinstall()


def own_process() -> None:
    """This process is ``python -m project``: once a command is done, the handlers stay until it exits."""
    _STATE.owns_process = True


def finish() -> None:
    """The command is done (or failed): stop signals are ignored, or (a notebook) the handlers found given back."""
    if _STATE.owns_process:
        _STATE.phase = "done"
        return
    install([], _STATE.grace_s)
    _STATE.phase, _STATE.first, _STATE.raised_in, _STATE.during_training = "before", None, None, None


def install_defaults() -> None:
    """Handle the default ``parallel.stop_signals`` from the first instant of a ``fit``, before torch is imported."""
    from project.plan.config import ParallelConfig

    defaults = ParallelConfig()
    install(defaults.stop_signals, defaults.stop_grace_s)


def stopped_early(stop: StopSignal) -> Preempted:
    """The one line for a stop before the run's Trainer exists (its imports, its config, its model)."""
    return Preempted(
        f"stopped by {stop.name} before the first training step (the run was starting): nothing was trained, so "
        f"there is nothing to save (exit code {Preempted.exit_code}: preempted, resumable)"
    )


def reinstall() -> None:
    """Put the handler back on every stop signal (after a library replaced it); main thread only."""
    if threading.current_thread() is threading.main_thread():
        for signum in _STATE.signals:
            signal.signal(signum, _handle)


def set_phase(phase: str, during_training: Callable[[int], None] | None = None) -> None:
    """Where the run is now (one of :data:`PHASES`); ``during_training`` handles a signal in ``training``."""
    assert phase in PHASES, phase
    _STATE.phase = phase
    if during_training is not None:
        _STATE.during_training = during_training


def phase() -> str:
    """Where the run is now."""
    return _STATE.phase


def first_signal() -> str | None:
    """The name of the first stop signal this process got, or ``None``."""
    return _STATE.first


def raised_in() -> str | None:
    """The phase in which a stop signal ended this rank at once (``before``/``after``), or ``None``."""
    return _STATE.raised_in


def set_kept(kept: Callable[[], str]) -> None:
    """What the grace exit says is kept (called in a thread, at the exit: keep it to reading files)."""
    _STATE.kept = kept


def set_undo(undo: Callable[[], None] | None) -> None:
    """What puts the run directory back when this process ends before the first step without unwinding (rank 0)."""
    _STATE.undo = undo


def undo_if_untrained() -> None:
    """Before the first step: put the run directory back (for exits that do not unwind); never raises."""
    if _STATE.phase == "before" and _STATE.undo is not None:
        with contextlib.suppress(Exception):
            _STATE.undo()


def is_rank_zero() -> bool:
    """Whether this process is global rank 0 (from the launcher's variables; one process is rank 0)."""
    return next((os.environ[key] for key in RANK_VARIABLES if os.environ.get(key)), "0") == "0"


def stopping() -> bool:
    """Whether this process is ending on a stop signal (its own, or one the ranks agreed on): within the grace."""
    return _STATE.grace is not None


def _handle(signum: int, frame: Any) -> None:
    # The one handler: dispatch by phase (never a store call or a collective in here).
    name = signal.Signals(signum).name
    first = _STATE.first is None
    _STATE.first = _STATE.first or name
    if _STATE.phase == "training" and _STATE.during_training is not None:
        _STATE.during_training(signum)
        return
    if _STATE.phase not in ENDS_AT_ONCE or not first:
        return  # unwinding, finished, or a stop raised already: a repeat must not interrupt its clean-up
    start_grace(name)
    _STATE.raised_in = _STATE.phase
    raise StopSignal(name, _STATE.phase)


def start_grace(why: str) -> None:
    """End this process with exit code 75 ``grace_s`` seconds from now, unless it ended before (once per process)."""
    if threading.current_thread() is threading.main_thread():
        finish_without_parent()  # the parent-death signal is the main thread's: only it can clear it
    if _STATE.grace is None:
        _STATE.grace = threading.Thread(target=_end_after_grace, args=(why,), name="project-stop-grace", daemon=True)
        _STATE.grace.start()


def _end_after_grace(why: str) -> None:
    threading.Event().wait(_STATE.grace_s)
    if is_rank_zero():  # every rank ends alike: one line
        kept = "this run had trained nothing yet, so nothing is lost" if _STATE.phase == "before" else _STATE.kept()
        undo_if_untrained()
        os.write(
            2,
            f"error: the stop on {why} did not complete within {_STATE.grace_s:g} s (parallel.stop_grace_s; a "
            f"validation or step ran longer); {kept}; resume with `fit --resume auto` (exit code "
            f"{Preempted.exit_code}: preempted, resumable)\n".encode(),
        )
    os._exit(Preempted.exit_code)


def peer_stopped(ranks: str) -> str:
    """Rank 0's one line when other ranks (``ranks``: "rank 1 (pid 42)") ended with exit code 75 before it."""
    # Otherwise a stop under way (training) that one rank did not finish.
    left = _LEFT.get(_STATE.phase) or f"and the stop did not complete on every rank; {_STATE.kept()}"
    return (
        f"{ranks} stopped on a signal (exit code {Preempted.exit_code}) {left}; resume with `fit --resume auto` "
        f"(exit code {Preempted.exit_code}: preempted, resumable)"
    )
