"""Sharded checkpoints written atomically: every rank's shards into a hidden folder, swapped onto the name whole.

Every rank writes into a hidden ``.last.ckpt.<token>.tmp/`` folder; when all have finished (DCP writes
``.metadata`` only then) rank 0 adds ``meta.pt``, syncs, and swaps the folder onto its name in one
``renameat2(RENAME_EXCHANGE)`` (two renames where the file system lacks it). A kill at any point leaves the
previous checkpoint under the name, or a hidden folder that nothing resumes from (:func:`remove_partial`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter

from project.checkpoints.sharded import LIGHTNING_META, OPTIMIZER, WEIGHTS


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system or file system lacks it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    return done == 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace(source: Path, target: Path) -> None:
    """Move ``source`` (a file or folder) onto ``target`` (a file, a folder, or nothing), atomically where possible.

    ``os.replace`` cannot put a folder over a non-empty folder, nor a file over a folder; an exchange can,
    after which ``source`` holds the old target and is removed.
    """
    if not target.exists() and not target.is_symlink():
        os.rename(source, target)
    elif _exchange(source, target):
        _remove(source)
    else:  # no atomic exchange here: two renames, the old one kept under a hidden name until the new is in place
        old = target.with_name(f"{source.name}.old")
        os.rename(target, old)
        os.rename(source, target)
        _remove(old)
    _fsync_folder(target.parent)


def partial_name(target: Path, token: str) -> Path:
    """The hidden name a checkpoint is written under before it is complete (``.last.ckpt.<token>.tmp``)."""
    return target.with_name(f".{target.name}.{token}.tmp")


def save_sharded(
    checkpoint: dict[str, Any], path: Path, token: str, is_rank_zero: bool, barrier: Callable[[], None]
) -> None:
    """Write a sharded checkpoint (every rank: collectives) atomically onto ``path``.

    Args:
        checkpoint: Lightning's checkpoint dict, its ``state_dict`` and ``optimizer_states`` sharded (DTensors).
        path: The checkpoint's name (``.../last.ckpt``), the same on every rank.
        token: A name part shared by all ranks and unique to this save.
        is_rank_zero: Global rank 0 writes ``meta.pt`` and puts the folder in place.
        barrier: Wait for every rank.
    """
    partial = partial_name(path, token)
    shards = {WEIGHTS: checkpoint[WEIGHTS]}
    shards.update({OPTIMIZER.format(i): state for i, state in enumerate(checkpoint.get("optimizer_states", []))})
    meta = {key: value for key, value in checkpoint.items() if key not in (WEIGHTS, "optimizer_states")}
    # Replicated tensors (buffers) are written by rank 0, as a DDP checkpoint holds rank 0's.
    planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    dcp.save(shards, storage_writer=FileSystemWriter(partial, sync_files=True, overwrite=False), planner=planner)
    if is_rank_zero:  # DCP wrote .metadata after every rank's shards: the folder is complete but for meta.pt
        with open(partial / LIGHTNING_META, "wb") as handle:
            torch.save(meta, handle)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_folder(partial)
        replace(partial, path)
    barrier()


def write_file_over(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a checkpoint file where a sharded folder of the same name is (a sharded run resumed on one process)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.chmod(0o644)
        replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def remove_partial(folder: Path) -> None:
    """Delete the hidden, incomplete checkpoints (files and folders) a killed save left in ``folder``."""
    for partial in folder.glob(".*.tmp"):
        _remove(partial)
