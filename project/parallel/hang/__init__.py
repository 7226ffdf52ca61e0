"""A hang names itself: at a stall every rank's stacks and last collectives land in ``<run>/hang/``, one line says who.

``records`` (this rank's record), ``workers`` (its DataLoader workers' stacks), ``verdict`` (the records compared:
pure), ``watch`` (each rank's watcher over the rendezvous store), ``callback`` (the loop phase, the watcher's life).
"""

from __future__ import annotations

from project.parallel.hang.callback import HangRecorder, current_watch

__all__ = ["HangRecorder", "current_watch", "stalled_ranks"]


def stalled_ranks(why: str) -> str | None:
    """At a collective's timeout: every rank's record taken (if not yet), the verdict's line; ``None`` off-run.

    The line names the rank(s) elsewhere and where, and the folder that holds every rank's stacks.
    """
    watch = current_watch()
    line = watch.explain(why) if watch is not None else None
    if line is None:
        return None
    return f"{line}. Every rank's stacks and last collectives: {watch.folder / 'hang'}"
