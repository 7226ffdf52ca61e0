"""Lightning's CheckpointIO with writes a kill cannot truncate, and a checkpoint the CLI already loaded read once.

Lightning's ``TorchCheckpointIO`` writes in place, so a kill mid-write leaves a truncated ``last.ckpt``: exactly the
file a restart wants. :class:`AtomicCheckpointIO` renames a hidden temporary file onto the target instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from project.checkpoints.atomic import atomic_write
from project.checkpoints.formats import format_of
from project.run_store import active

_Check = Callable[[dict[str, Any]], None]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves go to a temporary file that is renamed onto the target."""

    def __init__(self) -> None:
        super().__init__()
        self._preloaded: tuple[Path, dict[str, Any]] | None = None
        self._check: _Check | None = None

    def preload(self, path: str | os.PathLike[str], checkpoint: dict[str, Any], check: _Check | None = None) -> None:
        """Remember ``checkpoint``, loaded from ``path``: the next load of that path returns it, after ``check(it)``.

        ``check`` needs the whole model, which Lightning builds (``configure_model``) right before that load.
        """
        self._preloaded = (Path(path).resolve(), checkpoint)
        self._check = check

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The preloaded checkpoint of ``path`` (once), else Lightning's own read; a layer's format merged here."""
        if (found := format_of(path)) is not None:
            self._preloaded = None  # the CLI preloads a sharded folder's summary, which has no tensors
            return found.load(path)
        if self._preloaded is not None and "://" not in str(path) and Path(path).resolve() == self._preloaded[0]:
            checkpoint, self._preloaded = self._preloaded[1], None
            check, self._check = self._check, None
            if check is not None:
                check(checkpoint)
            return checkpoint
        where = {} if map_location is None else {"map_location": map_location}  # None: Lightning's default (CPU)
        return super().load_checkpoint(path, weights_only=weights_only, **where)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically; remote (``scheme://``) paths keep Lightning's writer."""
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        if (found := format_of(path)) is not None:  # a sharded run's folder of this name, resumed on one process
            found.write_over(Path(path), lambda handle: self.write(checkpoint, handle))
        else:
            atomic_write(path, lambda handle: self.write(checkpoint, handle))
        active().commit(path)  # a run directory in object storage: uploaded, then committed

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path``; in object storage its commit first, then its data."""
        super().remove_checkpoint(path)
        active().withdraw(path)

    def write(self, checkpoint: dict[str, Any], handle: IO[bytes]) -> None:
        """Serialise ``checkpoint`` into the open temporary file."""
        torch.save(checkpoint, handle)
