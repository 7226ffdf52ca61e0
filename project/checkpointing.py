"""Checkpoint writes that a kill cannot truncate: Lightning's CheckpointIO on top of :mod:`project.atomic`.

Lightning's own ``TorchCheckpointIO`` serialises into memory and then writes the target file in
place, so a process killed during that write leaves a truncated ``last.ckpt`` behind: exactly the
file a restart wants. :class:`AtomicCheckpointIO` writes a hidden temporary file next to the target
and renames it over the target, so the target is always either the previous or the new checkpoint.
The CLI installs it for every run (see :func:`with_atomic_checkpoint_io`).
"""

from __future__ import annotations

from typing import IO, Any

import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH

from project.atomic import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves go to a temporary file that is renamed onto the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically; remote (``scheme://``) paths keep Lightning's writer."""
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        atomic_write(path, lambda handle: self.write(checkpoint, handle))

    def write(self, checkpoint: dict[str, Any], handle: IO[bytes]) -> None:
        """Serialise ``checkpoint`` into the open temporary file."""
        torch.save(checkpoint, handle)


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The Trainer's ``plugins`` plus an :class:`AtomicCheckpointIO`, unless one CheckpointIO is already given."""
    if plugins is None:
        listed: list[Any] = []
    elif isinstance(plugins, (list, tuple)):
        listed = list(plugins)
    else:
        listed = [plugins]
    if any(isinstance(plugin, CheckpointIO) for plugin in listed):
        return listed  # the user chose how checkpoints are written (e.g. a cloud store)
    return [*listed, AtomicCheckpointIO()]
