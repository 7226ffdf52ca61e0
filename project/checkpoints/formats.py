"""Checkpoints that are not one ``torch.save`` file: a layer's format (the sharding layer's folders of shards).

A layer's ``checkpoint_formats`` answer :class:`CheckpointFormat`; every reader and writer asks :func:`format_of` first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import IO, Any, Protocol

from project.layers import hooks

PathLike = str | os.PathLike[str]


class CheckpointFormat(Protocol):
    """What the core asks of a checkpoint format a layer adds (each method on a local path)."""

    def holds(self, path: PathLike) -> bool:
        """Whether ``path`` is a complete checkpoint of this format."""

    def incomplete(self, path: Path) -> str | None:
        """Why ``path`` (a folder) is an incomplete checkpoint of this format, in one line; ``None`` if not one."""

    def summary(self, path: PathLike) -> dict[str, Any]:
        """The checkpoint without its tensors' data: enough to choose it, compare it with the model, resume it."""

    def load(self, path: PathLike, weights_only: bool = False) -> dict[str, Any]:
        """The checkpoint as one ordinary Lightning checkpoint in this process (``weights_only``: its weights)."""

    def write_over(self, path: Path, write: Callable[[IO[bytes]], Any]) -> None:
        """Write a checkpoint file (``write(handle)``) atomically where a checkpoint of this format is."""

    def hidden(self, folder: Path) -> dict[Path, Path]:
        """Checkpoint names of ``folder`` whose newest complete checkpoint a kill left under a hidden name: where."""

    def final_name(self, path: Path) -> Path:
        """The name a checkpoint found under a hidden name goes onto (``path`` itself otherwise)."""

    def recover(self, folder: Path) -> None:
        """Complete what a kill interrupted in ``folder`` (by the run that holds its lock)."""


@cache
def formats() -> tuple[CheckpointFormat, ...]:
    """The checkpoint formats of the installed layers."""
    return tuple(make() for make in hooks("checkpoint_formats"))


def format_of(path: PathLike) -> CheckpointFormat | None:
    """The format that holds the local ``path`` (a complete checkpoint of it); ``None``: a file, or nothing."""
    return None if "://" in str(path) else next((found for found in formats() if found.holds(path)), None)


def incomplete(path: Path) -> str | None:
    """Why the folder ``path`` is an incomplete checkpoint of some format; ``None`` if none claims it."""
    return next((reason for found in formats() if (reason := found.incomplete(path))), None)


def checkpoints_in(folder: Path) -> list[Path]:
    """Each checkpoint name's newest complete checkpoint in ``folder``: ``*.ckpt`` (not hidden), or a format's."""
    found = {path: path for path in folder.glob("*.ckpt") if not path.name.startswith(".")}
    for each in formats():
        found.update(each.hidden(folder))
    return list(found.values())


def final_name(path: Path) -> Path:
    """The name a checkpoint found by :func:`checkpoints_in` (perhaps under a hidden name) goes onto."""
    for each in formats():
        path = each.final_name(path)
    return path


def recover(folder: Path) -> None:
    """Complete the writes a kill interrupted in ``folder`` and delete the partial ones (``.*.tmp``)."""
    for each in formats():
        each.recover(folder)
    for partial in folder.glob(".*.tmp"):
        remove_path(partial)


def remove_path(path: Path) -> None:
    """Delete a checkpoint file or folder (what is already gone is no error)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
