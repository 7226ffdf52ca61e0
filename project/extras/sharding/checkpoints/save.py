"""Sharded checkpoints written atomically: every rank's shards into a hidden folder, swapped onto the name whole.

Every rank writes into a hidden ``.last.ckpt.<token>.tmp/`` folder; when all have finished (DCP writes
``.metadata`` only then) rank 0 adds ``meta.pt``, syncs, and swaps the folder onto its name in one
``renameat2(RENAME_EXCHANGE)``. A kill at any point before it leaves the previous checkpoint under the name and
a hidden folder that nothing resumes from (:func:`project.checkpoints.formats.recover` deletes it).

Where the file system lacks the exchange (NFS, Lustre) the swap takes renames, each atomic, recoverable from any
point (:func:`swap_by_renames`): the complete folder is first renamed ``.last.ckpt.<token>.new`` (the commit:
from then on it is the newest checkpoint), the old one ``.last.ckpt.<token>.old``, the new one onto the name,
and the old one removed. A kill in between leaves the newest complete checkpoint under ``.new`` (or the name):
:func:`committed` finds it for ``--resume auto`` and :func:`recover_swaps` (the next run, holding the lock)
completes the swap; an ``.old`` is never left behind.

:func:`save_sharded` does all of it before returning (``parallel.fsdp.async_save: false``);
:mod:`project.extras.sharding.checkpoints.asynchronous` runs the same steps in the background; in object storage, too.
"""

from __future__ import annotations

import ctypes
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter

from project.checkpoints.formats import remove_path
from project.extras.sharding.checkpoints import LIGHTNING_META, OPTIMIZER, WEIGHTS
from project.run_store import active


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


def replace(source: Path, target: Path) -> None:
    """Move ``source`` (a file or folder) onto ``target`` (a file, a folder, or nothing), atomically where possible.

    ``os.replace`` cannot put a folder over a non-empty folder, nor a file over a folder; an exchange can,
    after which ``source`` holds the old target and is removed.
    """
    if not target.exists() and not target.is_symlink():
        os.rename(source, target)
    elif _exchange(source, target):
        remove_path(source)
    else:  # no atomic exchange here (NFS, Lustre): renames, each a step recover_swaps can complete
        committed_name = swap_names(source)[0]
        os.rename(source, committed_name)
        _fsync_folder(target.parent)  # the commit is on disk before the old checkpoint leaves the name
        swap_by_renames(committed_name)
    _fsync_folder(target.parent)


_COMMITTED, _OLD = ".new", ".old"


def swap_names(partial: Path) -> tuple[Path, Path, Path]:
    """``.last.ckpt.<token>.tmp`` (or its ``.new``/``.old``) -> its committed name, its old name and its target."""
    stem = partial.name
    for suffix in (_COMMITTED, _OLD, ".tmp"):
        stem = stem.removesuffix(suffix)  # `.tmp.old`: a swap of an earlier version of this module
    name = stem.removeprefix(".").rpartition(".")[0]  # the token has no dot (hex, or mkstemp's letters)
    folder = partial.parent
    return folder / f"{stem}{_COMMITTED}", folder / f"{stem}{_OLD}", folder / name


def swap_by_renames(committed_name: Path) -> None:
    """Put a committed checkpoint (``.<name>.<token>.new``) onto its name, from whatever step a kill left it at.

    The old checkpoint is renamed ``.old`` (the name is empty until the next rename), the committed one onto the
    name, the old one removed. Each step is one atomic rename or a removal, and repeating this completes it.
    """
    _, old, target = swap_names(committed_name)
    if target.exists() or target.is_symlink():
        if old.exists() or old.is_symlink():
            remove_path(old)  # older than what holds the name now: not needed to roll back
        os.rename(target, old)
    os.rename(committed_name, target)
    _fsync_folder(target.parent)
    remove_path(old)


def _hidden(folder: Path, suffix: str, target: Path | None = None) -> list[Path]:
    """The hidden ``.<name>.<token><suffix>`` paths of checkpoints (``*.ckpt``; of ``target`` only), oldest first."""
    names = [(p, swap_names(p)[2]) for p in folder.glob(f".*{suffix}")]
    found = [p for p, name in names if name == target or (target is None and name.suffix == ".ckpt")]
    return sorted(found, key=lambda p: p.lstat().st_mtime_ns)


def committed(target: Path) -> Path | None:
    """Where the newest complete checkpoint of the name ``target`` is; ``None`` for none.

    A committed ``.new`` first, else the name, else the ``.old`` a kill left it under. Read only: nothing is renamed
    (the run that holds the lock does that: :func:`recover_swaps`).
    """
    found = _hidden(target.parent, _COMMITTED, target)
    if found:
        return found[-1]
    if target.exists():
        return target
    olds = _hidden(target.parent, _OLD, target)
    return olds[-1] if olds else None


def final_name(path: Path) -> Path:
    """The name a checkpoint found by :func:`committed` (perhaps under a hidden swap name) goes onto."""
    return swap_names(path)[2] if path.name.startswith(".") else path


def hidden_checkpoints(folder: Path) -> dict[Path, Path]:
    """The checkpoint names of ``folder`` a swap by renames left a hidden ``.new``/``.old`` of: their newest copy.

    Where each name's newest complete checkpoint is (:func:`committed`), for the core's ``--resume auto``.
    """
    names = {swap_names(p)[2] for p in (*_hidden(folder, _COMMITTED), *_hidden(folder, _OLD))}
    return {name: found for name in names if (found := committed(name)) is not None}


def recover_swaps(folder: Path) -> None:
    """Complete the swaps by renames a kill interrupted in ``folder`` (by the run that holds its lock).

    A committed ``.new`` goes onto its name; an ``.old`` is removed when its name holds a checkpoint, else put
    back (a swap killed before its commit leaves no ``.new``: the name's checkpoint was never moved).
    """
    for committed_name in _hidden(folder, _COMMITTED):  # oldest first: the newest ends under the name
        swap_by_renames(committed_name)
    for old in _hidden(folder, _OLD):
        target = swap_names(old)[2]
        if target.exists() or target.is_symlink():
            remove_path(old)
        else:
            os.rename(old, target)
    _fsync_folder(folder)


def partial_name(target: Path, token: str) -> Path:
    """The hidden name a checkpoint is written under before it is complete (``.last.ckpt.<token>.tmp``)."""
    return target.with_name(f".{target.name}.{token}.tmp")


def split(checkpoint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Lightning's checkpoint dict as DCP's sharded part (weights, each optimizer's state) and ``meta.pt``'s rest."""
    shards = {WEIGHTS: checkpoint[WEIGHTS]}
    shards.update({OPTIMIZER.format(i): state for i, state in enumerate(checkpoint.get("optimizer_states", []))})
    meta = {key: value for key, value in checkpoint.items() if key not in (WEIGHTS, "optimizer_states")}
    return shards, meta


def shard_writer(partial: Path) -> FileSystemWriter:
    """DCP's writer into the hidden folder: every file fsynced, never into a folder that holds a checkpoint."""
    return FileSystemWriter(partial, sync_files=True, overwrite=False)


def shard_planner() -> DefaultSavePlanner:
    """DCP's planner; replicated tensors (buffers) are written by rank 0, as a DDP checkpoint holds rank 0's."""
    return DefaultSavePlanner(dedup_save_to_lowest_rank=True)


def serialize(meta: dict[str, Any]) -> bytes:
    """``meta.pt``'s bytes (taken on the training thread: what the loops and callbacks hold may change after)."""
    buffer = io.BytesIO()
    torch.save(meta, buffer)
    return buffer.getvalue()


def finish(partial: Path, path: Path, meta: bytes) -> None:
    """Rank 0, once DCP wrote ``.metadata`` (after every rank's shards): add ``meta.pt``, sync, swap onto ``path``."""
    with open(partial / LIGHTNING_META, "wb") as handle:
        handle.write(meta)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_folder(partial)
    replace(partial, path)


def save_sharded(
    checkpoint: dict[str, Any], path: Path, token: str, is_rank_zero: bool, barrier: Callable[[], None]
) -> None:
    """Write a sharded checkpoint (every rank: collectives) atomically onto ``path``, before returning.

    Args:
        checkpoint: Lightning's checkpoint dict, its ``state_dict`` and ``optimizer_states`` sharded (DTensors).
        path: The checkpoint's name (``.../last.ckpt``), the same on every rank.
        token: A name part shared by all ranks and unique to this save.
        is_rank_zero: Global rank 0 writes ``meta.pt`` and puts the folder in place.
        barrier: Wait for every rank.
    """
    partial = partial_name(path, token)
    shards, meta = split(checkpoint)
    dcp.save(shards, storage_writer=shard_writer(partial), planner=shard_planner())
    # DCP wrote .metadata after every rank's shards: rank 0 adds meta.pt (in a store: after every rank's upload)
    active().commit_sharded(partial, path, token, serialize(meta) if is_rank_zero else None, None, finish)
    barrier()
    active().drop_node_copy(partial)


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
