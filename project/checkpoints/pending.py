"""Checkpoint writes in flight in this process, so that nothing here reads a half-written file; no Lightning import."""

from __future__ import annotations

import os
import threading
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

from project.run_store import active

_lock = threading.Lock()
_writes: dict[Path, Future[None]] = {}


def track(path: str | os.PathLike[str], write: Future[None]) -> None:
    """Register ``write``, the background write of ``path``; it is forgotten once it has finished."""
    key = Path(path).resolve()
    with _lock:
        _writes[key] = write

    def forget(done: Future[None]) -> None:
        with _lock:
            if _writes.get(key) is done:
                del _writes[key]

    write.add_done_callback(forget)


def wait_for(path: str | os.PathLike[str] | None = None) -> None:
    """Block until the background write of ``path`` (``None``: of every file) has finished, failed or not."""
    with _lock:
        writes = list(_writes.values()) if path is None else [_writes.get(Path(path).resolve())]
    futures.wait([write for write in writes if write is not None])  # a failed write is the writer's to raise
    if path is not None:
        active().local_copy(str(path))  # a run directory in object storage: what this node lacks, fetched
