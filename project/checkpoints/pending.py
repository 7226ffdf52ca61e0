"""Checkpoint writes still in flight in this process, so that nothing here reads a file before it is complete.

:class:`project.checkpoints.background.BackgroundCheckpointIO` writes checkpoints on a thread; it registers each
write here. :func:`project.checkpoints.loading.safe_load` waits for a write of the file it reads (the export at the
end of ``fit`` reads the best checkpoint right after it was saved), and a message that names "the last good
checkpoint" waits for all of them first. No Lightning import: ``loading`` stays importable without it.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

from project.run_store import active

_lock = threading.Lock()
_writes: dict[Path, Future[None]] = {}


def _key(path: str | os.PathLike[str]) -> Path:
    return Path(path).resolve()


def track(path: str | os.PathLike[str], write: Future[None]) -> None:
    """Register ``write``, the background write of ``path``; it is forgotten once it has finished."""
    key = _key(path)
    with _lock:
        _writes[key] = write

    def forget(done: Future[None]) -> None:
        with _lock:
            if _writes.get(key) is done:
                del _writes[key]

    write.add_done_callback(forget)


def wait_for(path: str | os.PathLike[str] | None = None) -> None:
    """Block until the background write of ``path`` (``None``: of every file) has finished, failed or not.

    A failed write is not raised here: the writer reports it (its file was left as it was before).
    """
    with _lock:
        writes = list(_writes.values()) if path is None else [w for w in (_writes.get(_key(path)),) if w is not None]
    futures.wait(writes)  # a failed write is the writer's to raise
    if path is not None:
        active().local_copy(str(path))  # a run directory in object storage: what this node lacks, fetched
