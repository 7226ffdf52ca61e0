"""Sharded (DCP, fsdp) checkpoints committed to a store: every rank uploads its own shards, rank 0 commits last.

On nodes that share no disk each rank's shards exist on its own node only. So, once DCP has written a save into
its hidden folder (every rank's ``__<rank>_<n>.distcp``; rank 0's ``.metadata`` after all of them):

:func:`publish` runs on every rank:

1. every rank uploads the files it wrote itself under the save's data token (:func:`upload_own`);
2. the ranks exchange what they uploaded, or the error that stopped them (:func:`gather_uploads`, a collective):
   a failure anywhere fails the save on every rank alike, and nothing is committed;
3. rank 0 puts the folder under its name locally, uploads ``meta.pt``, then writes the one commit object naming
   every rank's files (:func:`commit`): the commit comes after every rank's upload is known complete.

A kill at any moment before step 3's commit leaves the previous commit chosen (its data untouched); the uploaded
shards of the killed save are data no commit names, removed by the next run holding the lease. Each node's hidden
folder of a save that rank 0 did not swap onto a name (a disk of its own) is removed once the save is committed
(:func:`drop_node_copy`): the store holds it, and a resume pulls it whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from project.extras.storage import commits, location, objects, records

#: DCP's file of the checkpoint's layout, written by its coordinator (rank 0) after every rank's shards.
_METADATA = ".metadata"
#: Lightning's part of a sharded checkpoint (loops, callbacks), added by rank 0 last (checkpoints.sharded's name).
_META = "meta.pt"
# What the ranks exchange: (files uploaded | None on a local run, the error that stopped this rank | None).
Upload = tuple[dict[str, dict[str, Any]] | None, str | None]


def in_store(path: Path) -> bool:
    """Whether the checkpoint ``path`` is in a store's scratch cache (the same answer on every rank)."""
    return location.of(path) is not None


def own_files(partial: Path, rank: int) -> list[Path]:
    """The files of a DCP folder that ``rank`` wrote: its ``__<rank>_*.distcp``, and rank 0's ``.metadata``."""
    mine = sorted(partial.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (partial / _METADATA).is_file():
        mine.append(partial / _METADATA)
    return mine


def upload_own(partial: Path, path: Path, token: str, rank: int) -> dict[str, dict[str, Any]]:
    """Upload this rank's files of the save ``partial`` (of the checkpoint ``path``) under its data token."""
    located = location.of(path)
    if located is None:
        return {}
    store, remote = located
    data = commits.data_path(remote, token)
    return {file.name: objects.put(store.fs, file, f"{data}/{file.name}") for file in own_files(partial, rank)}


def gather_uploads(mine: Upload, group: Any = None) -> dict[str, dict[str, Any]]:
    """Every rank's uploaded files, merged (a collective over ``group``: every rank calls it).

    Raises:
        RuntimeError: a rank could not upload (or write) its shards: the same error on every rank.
    """
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    failed = [f"rank {rank}: {error}" for rank, (_, error) in enumerate(everyone) if error is not None]
    if failed:
        raise RuntimeError("; ".join(failed))
    merged: dict[str, dict[str, Any]] = {}
    for files, _ in everyone:
        merged.update(files or {})
    return merged


def publish(
    partial: Path, path: Path, token: str, meta: bytes | None, group: Any, finish: Callable[[Path, Path, bytes], None]
) -> None:
    """Every rank, once DCP wrote the save: its own shards up; then rank 0 swaps the folder in and commits it.

    On a local run only rank 0's ``finish``, with no collective.

    Args:
        partial: The save's hidden folder.
        path: The checkpoint's name (``.../last.ckpt``).
        token: The save's token, also its data's in the store.
        meta: ``meta.pt``'s bytes on rank 0 (it finishes and commits), ``None`` on the other ranks.
        group: The process group of the exchange of what each rank uploaded (``None``: the default group).
        finish: Rank 0's local completion of the folder (adds ``meta.pt``, swaps it onto ``path``).

    Raises:
        RuntimeError: a rank could not upload its shards (on every rank alike; nothing is committed).
    """
    if not in_store(path):
        if meta is not None:
            finish(partial, path, meta)
        return
    rank = dist.get_rank(group)
    mine: Upload
    try:
        mine = (upload_own(partial, path, token, rank), None)
    except Exception as error:  # s3fs and the store raise more than OSError: every rank must hear of it
        mine = (None, f"{type(error).__name__}: {error}")
    files = gather_uploads(mine, group)  # every rank's upload known complete before the commit
    if meta is not None:
        finish(partial, path, meta)
        commit(path, token, files, path / _META)


def commit(path: Path, token: str, files: dict[str, dict[str, Any]], meta: Path) -> None:
    """Rank 0, with the folder complete under ``path``: upload ``meta`` (its ``meta.pt``), then the commit object."""
    located = location.of(path)
    if located is None:
        return
    store, remote = located
    files = {**files, meta.name: objects.put(store.fs, meta, f"{commits.data_path(remote, token)}/{meta.name}")}
    commits.upload(store, path, files=files, data_token=token)
    records.sync(store, path.parent.parent)


def drop_node_copy(partial: Path) -> None:
    """After a committed save: this node's hidden folder of it, if rank 0 did not swap it onto a name here."""
    if partial.is_dir() and in_store(partial):
        shutil.rmtree(partial, ignore_errors=True)
