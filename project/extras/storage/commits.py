"""Commit-then-point: a checkpoint in the store is complete only once its commit object names it.

A checkpoint ``<run>/checkpoints/last.ckpt`` (a file, or a sharded folder) goes up in two steps:

1. its data under a fresh token, ``checkpoints/.data/<token>/last.ckpt`` (a folder's files one by one);
2. one small PUT of ``checkpoints/last.ckpt.commit``: the data's path, each file's size and SHA-256, the time.

Readers (``--resume auto``, ``--ckpt_path last``, ``consolidate``) read commit objects only, so a kill at any
moment of step 1 leaves the previous commit, and its data, chosen and loadable. After step 2 the previous
checkpoint's data is removed; data no commit names (a killed upload) is removed only by the run holding the
run's lease (:func:`clean_uncommitted`), never while another training may still be uploading it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from project.extras.storage import objects
from project.extras.storage.location import Store

#: What a commit object's name ends with.
COMMIT_SUFFIX = ".commit"
#: The folder of checkpoint data, in a run's ``checkpoints/``.
DATA = ".data"


def commit_path(remote: str) -> str:
    """The commit object of a checkpoint's store path."""
    return remote + COMMIT_SUFFIX


def upload(
    store: Store, local: Path, files: dict[str, dict[str, Any]] | None = None, data_token: str | None = None
) -> dict[str, Any]:
    """Upload the checkpoint ``local`` (file or folder) under a fresh token, then commit it with one PUT.

    ``files`` (relative name -> size and SHA-256) is given when the folder's files were uploaded already (every
    rank its own shards, under ``data_token``: :func:`data_path`); else they are uploaded here.
    """
    remote = store.remote(local)
    if remote is None:
        raise ValueError(f"{local} is not in the scratch cache of {store.url}")
    folder, name = remote.rsplit("/", 1)
    data = f"{DATA}/{data_token or token()}/{name}"
    if files is None:
        files = upload_files(store, local, f"{folder}/{data}")
    previous, _ = objects.read_json(store.fs, commit_path(remote))
    record = {
        "name": name,
        "data": data,
        "files": files,
        "committed_ns": time.time_ns(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    objects.write(store.fs, commit_path(remote), json.dumps(record, sort_keys=True, indent=1).encode())  # commit
    if previous is not None and previous.get("data") != data:
        _remove_data(store, folder, previous)
    return record


def token() -> str:
    """A fresh data token: time first, so a listing reads oldest first."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def data_path(remote: str, data_token: str) -> str:
    """The store path the data of the checkpoint ``remote`` goes under for ``data_token`` (before its commit)."""
    folder, name = remote.rsplit("/", 1)
    return f"{folder}/{DATA}/{data_token}/{name}"


def upload_files(store: Store, local: Path, data_remote: str) -> dict[str, dict[str, Any]]:
    """Upload a checkpoint file (``""``) or each file of a sharded folder (by relative name) under ``data_remote``."""
    if not local.is_dir():
        return {"": objects.put(store.fs, local, data_remote)}
    files = {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        relative = path.relative_to(local).as_posix()
        files[relative] = objects.put(store.fs, path, f"{data_remote}/{relative}")
    return files


def withdraw(store: Store, local: Path) -> None:
    """Remove a checkpoint from the store: its commit first (no reader chooses it from then on), then its data."""
    remote = store.remote(local)
    if remote is None:
        return
    record, _ = objects.read_json(store.fs, commit_path(remote))
    objects.remove(store.fs, commit_path(remote))
    if record is not None:
        _remove_data(store, remote.rsplit("/", 1)[0], record)


def committed(store: Store, checkpoints_remote: str) -> dict[str, dict[str, Any]]:
    """The committed checkpoints of one run's ``checkpoints/`` folder in the store: name -> commit record."""
    found = {}
    for entry in objects.listing(store.fs, checkpoints_remote):
        if entry.endswith(COMMIT_SUFFIX):
            record, _ = objects.read_json(store.fs, f"{checkpoints_remote}/{entry}")
            if record is not None and isinstance(record.get("files"), dict):
                found[entry[: -len(COMMIT_SUFFIX)]] = record
    return found


def clean_uncommitted(store: Store, checkpoints_remote: str) -> list[str]:
    """Remove the data no commit names (uploads a kill interrupted); call only while holding the run's lease."""
    named = {record["data"].split("/")[1] for record in committed(store, checkpoints_remote).values()}
    removed = []
    for entry in objects.listing(store.fs, f"{checkpoints_remote}/{DATA}"):
        if entry not in named:
            objects.remove(store.fs, f"{checkpoints_remote}/{DATA}/{entry}", recursive=True)
            removed.append(entry)
    return removed


def _remove_data(store: Store, folder: str, record: dict[str, Any]) -> None:
    parts = str(record.get("data", "")).split("/")
    if len(parts) >= 2 and parts[0] == DATA and parts[1]:  # only ever a token folder under .data
        objects.remove(store.fs, f"{folder}/{DATA}/{parts[1]}", recursive=True)
