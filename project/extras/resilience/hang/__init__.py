"""A hang names itself: at a stall every rank's stacks and last collectives land in ``<run>/hang/``, one line says who.

``records`` (this rank's record), ``workers`` (its DataLoader workers' stacks), ``verdict`` (the records compared:
pure), ``watch`` (each rank's watcher over the rendezvous store), ``callback`` (the loop phase, the watcher's life).
"""

from __future__ import annotations

from project.extras.resilience.hang.callback import HangRecorder, current_watch
from project.extras.resilience.hang.watch import HangWatch

__all__ = ["HangRecorder", "current_watch", "explain_stall", "known_stall", "stalled_ranks"]


def stalled_ranks(why: str) -> str | None:
    """At a collective's timeout: every rank's record taken (if not yet), the verdict's line; ``None`` off-run.

    The line names the rank(s) elsewhere and where, and the folder that holds every rank's stacks.
    """
    watch = current_watch()
    return _with_folder(watch, watch.explain(why) if watch is not None else None)


def known_stall() -> str | None:
    """The verdict's line when this run's ranks already recorded a stall (a lost peer ended at its timeout)."""
    watch = current_watch()
    return _with_folder(watch, watch.summary() if watch is not None else None)


def explain_stall(why: str | None) -> str | None:
    """The layer's ``explain_stall`` hook: ``why`` given, :func:`stalled_ranks`; ``None``, :func:`known_stall`."""
    return stalled_ranks(why) if why is not None else known_stall()


def _with_folder(watch: HangWatch | None, line: str | None) -> str | None:
    if watch is None or line is None:
        return None
    return f"{line}. Every rank's stacks and last collectives: {watch.folder / 'hang'}"
