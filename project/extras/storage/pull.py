"""A run resumed from an empty disk: the store's committed checkpoints brought into this node's scratch cache.

Every process (on every node) pulls for itself before choosing its checkpoint, as every process finds its
checkpoint on a shared disk: the committed checkpoints of the newest committed version of the run name (or of
the version the config names) are downloaded into ``<scratch>/<name>/<version>/checkpoints/``, checked against
their commit's SHA-256, and dated by their commit time, so that ``--resume auto`` chooses among them as among
files. A cached file that is not what the store committed (a save whose upload a kill interrupted) is replaced:
the cache is not a record. From then on only committed names count (:func:`counts`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from project.errors import UserError, first_line
from project.extras.storage import location, objects
from project.extras.storage.commits import COMMIT_SUFFIX, commit_path, committed
from project.extras.storage.location import Store, active, is_url, open_store

# The cached checkpoint paths this process pulled, each the copy of a commit.
_PULLED: set[Path] = set()


def pull(store: Store, name_root: Path, version: str | None) -> Path | None:
    """Bring the committed checkpoints of the newest committed run of ``name_root`` into the cache; its folder."""
    remote_root = store.remote(name_root)
    if remote_root is None:
        return None
    versions = [version] if version else objects.listing(store.fs, remote_root)
    newest: tuple[int, str, dict[str, dict[str, Any]]] | None = None
    for run in versions:
        if not run.startswith("version_") and version is None:
            continue
        records = committed(store, f"{remote_root}/{run}/checkpoints")
        if records:
            when = max(int(r.get("committed_ns", 0)) for r in records.values())
            if newest is None or when > newest[0]:
                newest = (when, run, records)
    if newest is None:
        return None
    _, run, records = newest
    checkpoints = name_root / run / "checkpoints"
    for name, record in records.items():
        try:
            fetch(store, f"{remote_root}/{run}/checkpoints", record, checkpoints / name)
        except (FileNotFoundError, objects.DamagedObject) as error:  # left out: the resume takes an intact one
            sys.stderr.write(f"warning: the committed checkpoint {name} of {run} is left out: {first_line(error)}\n")
    return name_root / run


def checkpoint_at(path: str) -> str:
    """``path`` itself, or for a checkpoint's URL (``--ckpt_path``, ``consolidate``) its committed copy in the cache.

    The copy is ``$PROJECT_SCRATCH_DIR/<scheme>/<bucket>/<key>`` (the path a run's own cache gives it), fetched
    unless it holds the commit's files already.

    Raises:
        UserError: no commit names a checkpoint at the URL.
    """
    if not is_url(path):
        return path
    store = open_store(path)
    record, _ = objects.read_json(store.fs, commit_path(store.root))
    if record is None or not isinstance(record.get("files"), dict):
        raise UserError(
            f"{path} is not a committed checkpoint ({path}{COMMIT_SUFFIX} is not in the store); give the URL of a "
            "checkpoint a run committed, e.g. s3://bucket/prefix/<name>/version_<n>/checkpoints/last.ckpt"
        )
    fetch(store, store.root.rsplit("/", 1)[0], record, store.scratch)
    return str(store.scratch)


def complete(path: str | os.PathLike[str]) -> None:
    """A checkpoint of the store's cache (or a file of its folder) made whole on this node before it is read.

    On nodes that share no disk a node holds only its own shards of a sharded save (node 1 none of rank 0's
    ``meta.pt``): a read of it (the test after fit, the export of the best checkpoint) fetches what its commit
    names. Nothing happens outside a store's cache, for a checkpoint without a commit, or when the cache holds it.
    """
    located = location.of(path)
    if located is None:
        return
    store, remote = located
    for candidate in (remote, remote.rsplit("/", 1)[0]):  # the checkpoint itself, or the folder of this file
        record, _ = objects.read_json(store.fs, commit_path(candidate))
        if record is not None and isinstance(record.get("files"), dict):
            fetch(store, candidate.rsplit("/", 1)[0], record, store.local(candidate))
            return


def fetch(store: Store, folder_remote: str, record: dict[str, Any], local: Path) -> None:
    """Make ``local`` the committed checkpoint ``record`` names (downloaded unless the cache holds it already)."""
    files: dict[str, dict[str, Any]] = record["files"]
    data = f"{folder_remote}/{record['data']}"
    if set(files) == {""}:
        if not _same(local, files[""]):
            objects.get(store.fs, data, local, files[""])
    else:
        _fetch_folder(store, data, files, local)
    stamp = int(record.get("committed_ns", 0))
    os.utime(local, ns=(stamp, stamp))
    _PULLED.add(Path(os.path.abspath(local)))


def _fetch_folder(store: Store, data: str, files: dict[str, dict[str, Any]], local: Path) -> None:
    """A sharded folder: each file downloaded into a hidden folder, which then takes the name."""
    if local.is_dir() and all(_same(local / name, entry) for name, entry in files.items()):
        return
    partial = local.with_name(f".{local.name}.{os.getpid()}.download")
    shutil.rmtree(partial, ignore_errors=True)
    for name, entry in files.items():
        objects.get(store.fs, f"{data}/{name}", partial / name, entry)
    if local.is_dir() and all(_same(local / name, entry) for name, entry in files.items()):
        shutil.rmtree(partial)  # another process of this node fetched it meanwhile (and may be reading it)
        return
    stale = local.with_name(f".{local.name}.{os.getpid()}.stale")  # the incomplete copy, moved aside in one step
    with contextlib.suppress(FileNotFoundError):
        os.replace(local, stale)
    try:
        os.replace(partial, local)
    except OSError:  # another process of this node put its whole copy there in between: keep that one
        shutil.rmtree(partial)
    if stale.is_dir():
        shutil.rmtree(stale)
    elif stale.exists():
        stale.unlink()


def _same(local: Path, entry: dict[str, Any]) -> bool:
    try:
        return local.stat().st_size == entry.get("size") and objects.sha256_of(local) == entry.get("sha256")
    except OSError:
        return False


def counts(path: Path) -> bool:
    """Whether ``path`` may be chosen to resume: always on a local run; in a store's cache, only a pulled commit."""
    store = active()
    if store is None or store.remote(path) is None:
        return True
    return Path(os.path.abspath(path)) in _PULLED
