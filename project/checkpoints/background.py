"""Checkpoints written on a thread: a save costs the training a copy of the state, not the disk.

:class:`BackgroundCheckpointIO` is :class:`~project.checkpoints.io.AtomicCheckpointIO` (a hidden temporary file,
fsync, one rename) whose writes run on one background thread:

- ``save_checkpoint`` copies every tensor of the checkpoint on the calling (training) thread, so that the next
  optimizer step cannot change what is written, hands the copy to the thread and returns. The next save waits
  only if the previous one is still writing, so at most one write (and one copy) is in flight.
- A write that failed is raised at the next save, at the end of the stage (``teardown``, which Lightning calls
  at the end of every ``fit``/``validate``/``test``) and never silently: the target file is then the previous
  checkpoint, intact. The thread is joined before the process exits.
- Removals (a ``ModelCheckpoint`` replacing its previous best) queue behind the writes, in order, and run only
  if every write queued before them succeeded: a failed save never costs the file it was to replace.
- Anything in this process that reads a checkpoint file waits for its write first (:mod:`pending`).

Lightning's own ``AsyncCheckpointIO`` clones the tensors too, but queues any number of writes (each holding a
copy of the state), raises a failed write only at the next save or teardown, and leaves removals unordered
with the writes; its wrapped IO is replaced by ``TorchCheckpointIO`` (not atomic) unless configured.
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
    """``checkpoint`` with every tensor copied (containers rebuilt), so that training can go on changing its own.

    On a GPU the copies stay on the device (a fast device-to-device copy; the writer moves them to the host).
    """
    return apply_to_collection(checkpoint, torch.Tensor, lambda tensor: tensor.detach().clone())


def first_failure(in_flight: list[tuple[str, Future[None]]]) -> tuple[str, BaseException] | None:
    """What the first of the writes in flight that failed was to do, and its error (after waiting for them all)."""
    failed: tuple[str, BaseException] | None = None
    for what, done in in_flight:
        error = done.exception()  # waits
        if error is not None and failed is None:
            failed = (what, error)
    return failed


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
        copy = snapshot(checkpoint)
        write = self._submit(f"write the checkpoint {path}", super().save_checkpoint, copy, path)
        pending.track(path, write)

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path`` after the writes queued before (it may be one of them), only if all of them succeeded.

        A ``ModelCheckpoint`` removes its previous best right after saving the new one: if that save failed (a
        full disk), the previous best is the only one left and must stay.
        """
        before = [done for _, done in self._in_flight]
        self._submit(f"remove the checkpoint {path}", self._remove_after, before, path)

    def _remove_after(self, before: list[Future[None]], path: Any) -> None:
        # Runs on the writer thread, after every future in `before` (one worker runs them in order).
        if any(done.exception() is not None for done in before):
            return
        super().remove_checkpoint(path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's read (or the preloaded checkpoint), once a write of ``path`` has finished."""
        if "://" not in str(path):
            pending.wait_for(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def wait(self) -> None:
        """Block until every queued write and removal has finished; raise the first that failed.

        Raises:
            CheckpointWriteError: a write or removal failed (the file it was to replace is intact).
        """
        in_flight, self._in_flight = self._in_flight, []
        failed = first_failure(in_flight)
        if failed is not None:
            what, error = failed
            raise CheckpointWriteError(
                f"could not {what} ({type(error).__name__}: {error}); the file it was to replace is intact. "
                "Free disk space or fix the folder's permissions, then resume from the last checkpoint"
            ) from error

    def teardown(self) -> None:
        """Finish the writes, stop the thread; raise a failed write (say it, if another error ends the run)."""
        ending = sys.exc_info()[1]  # Lightning tears down in its handler of the run's own error
        try:
            self.wait()
        except CheckpointWriteError as error:
            if ending is None:
                raise
            # Keep the run's own error (what ended it), say this one.
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
    """The Trainer's ``plugins`` plus an atomic CheckpointIO, unless one CheckpointIO is already given.

    The one installed writes in the background
    (:class:`BackgroundCheckpointIO`): a save costs the training a copy of the state.
    """
    if plugins is None:
        listed: list[Any] = []
    elif isinstance(plugins, (list, tuple)):
        listed = list(plugins)
    else:
        listed = [plugins]
    if any(isinstance(plugin, CheckpointIO) for plugin in listed):
        return listed  # the user chose how checkpoints are written (e.g. a cloud store)
    return [*listed, BackgroundCheckpointIO()]
