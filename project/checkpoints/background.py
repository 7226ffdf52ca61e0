"""Checkpoints written on a thread: a save costs the training a copy of the state, not the disk.

:class:`BackgroundCheckpointIO` copies the tensors on the training thread and writes on one writer thread: at most one
copy in flight. A failed write is raised at the next save or ``teardown`` (its target intact); removals run behind the
writes, only if those succeeded. Lightning's ``AsyncCheckpointIO`` queues any number of copies, leaves removals
unordered, and wraps a non-atomic ``TorchCheckpointIO``.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from project.checkpoints import pending
from project.checkpoints.io import AtomicCheckpointIO
from project.errors import RunFailure


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written in the background; the file it was to replace is intact."""


def snapshot(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with every tensor copied (on its device: the writer moves it to the host), containers rebuilt."""
    return apply_to_collection(checkpoint, torch.Tensor, lambda tensor: tensor.detach().clone())


def first_failure(in_flight: list[tuple[str, Future[None]]]) -> tuple[str, BaseException] | None:
    """What the first of the writes in flight that failed was to do, and its error (after waiting for them all)."""
    errors = [(what, done.exception()) for what, done in in_flight]  # waits for each
    return next(((what, error) for what, error in errors if error is not None), None)


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """:class:`AtomicCheckpointIO` whose writes happen on a background thread, one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: list[tuple[str, Future[None]]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Copy the checkpoint's tensors and write it atomically on the background thread (remote paths: here)."""
        self.wait()
        if "://" in str(path) or storage_options is not None:
            super().save_checkpoint(checkpoint, path, storage_options)  # Lightning's writer, or its TypeError
            return
        write = self._submit(f"write the checkpoint {path}", super().save_checkpoint, snapshot(checkpoint), path)
        pending.track(path, write)

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path`` after the writes queued before, if they all succeeded: a failed save keeps the old best."""
        before = [done for _, done in self._in_flight]
        self._submit(f"remove the checkpoint {path}", self._remove_after, before, path)

    def _remove_after(self, before: list[Future[None]], path: Any) -> None:
        # On the writer thread, after every future in `before` (one worker runs them in order).
        if all(done.exception() is None for done in before):
            super().remove_checkpoint(path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's read (or the preloaded checkpoint), once a write of ``path`` has finished."""
        if "://" not in str(path):
            pending.wait_for(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def wait(self) -> None:
        """Block until every queued write and removal has finished; raise the first that failed (its file intact)."""
        in_flight, self._in_flight = self._in_flight, []
        failed = first_failure(in_flight)
        if failed is not None:
            what, error = failed
            raise CheckpointWriteError(
                f"could not {what} ({type(error).__name__}: {error}); the file it was to replace is intact. "
                "Free disk space or fix the folder's permissions, then resume from the last checkpoint"
            ) from error

    def teardown(self) -> None:
        """Finish the writes, stop the thread; raise a failed write (only say it if another error ends the run)."""
        ending = sys.exc_info()[1]  # Lightning tears down in its handler of the run's own error
        try:
            self.wait()
        except CheckpointWriteError as error:
            if ending is None:
                raise
            sys.stderr.write(f"warning: {error}\n")
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _submit(self, what: str, fn: Any, *args: Any) -> Future[None]:
        if self._executor is None:  # made lazily: teardown ends it, and a Trainer may fit, then test
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        done = self._executor.submit(fn, *args)
        self._in_flight.append((what, done))
        return done


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The Trainer's ``plugins`` plus a :class:`BackgroundCheckpointIO`, unless a CheckpointIO is already given."""
    listed = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(plugin, CheckpointIO) for plugin in listed):
        return listed  # the user chose how checkpoints are written (e.g. a cloud store)
    return [*listed, BackgroundCheckpointIO()]
