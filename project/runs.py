"""Read back what a run left behind in its run directory (``logs/<name>/version_<n>/``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_scalars(run_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a run's TensorBoard event files, as ``tag -> [(step, value), ...]`` in file order.

    A ``fit`` that tests afterwards writes one event file per stage; their scalars are concatenated,
    oldest file first, so e.g. ``train/loss`` and ``test/acc`` come back from the same call.
    """
    # Imported here: TensorBoard's event reader is slow to import and only needed when reading.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})  # 0: keep every point
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((event.step, event.value) for event in accumulator.Scalars(tag))
    return scalars


def run_directory(trainer: Any) -> str | None:
    """The run directory, ``trainer.log_dir``: call it on EVERY rank, never under a rank check.

    Lightning broadcasts it from rank 0, a collective: a rank that skips the call leaves the others waiting
    (Lightning#18148). Every writer of the run directory asks here, then lets rank 0 write.
    """
    return trainer.log_dir
