"""What the storage layer asks of a store: a digest on the way up, atomic reads down, and two conditional writes.

``create`` (write only if absent) and ``replace`` (write only if unchanged since read) are what a lease and a
version reservation need. On S3 they are one request each (``If-None-Match: *``, ``If-Match: <etag>`` on the PUT;
AWS since 2024, MinIO, moto); on a local or mounted file system ``create`` is ``O_EXCL`` and ``replace`` a read,
compare, write (not atomic: two takers of one expired lease at the same instant may both win there).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 8 << 20


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a local file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is S3 (s3fs): the conditional writes go to the server as headers."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("s3", "s3a")


def put(fs: Any, local: str | os.PathLike[str], remote: str) -> dict[str, Any]:
    """Upload one local file; its size and SHA-256 (read from the file before it goes up), for a commit."""
    entry = {"size": os.path.getsize(local), "sha256": sha256_of(local)}
    _parents(fs, remote)
    fs.put_file(str(local), remote)
    return entry


def write(fs: Any, remote: str, data: bytes) -> None:
    """Write a small object in one request (a commit, a record)."""
    _parents(fs, remote)
    fs.pipe_file(remote, data)


def _parents(fs: Any, remote: str) -> None:
    """A file system with folders (``file://``, a mount) needs the parents; an object store has none to make."""
    if not is_s3(fs):
        fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)


class DamagedObject(OSError):
    """An object whose size or SHA-256 is not what its commit names."""


def get(fs: Any, remote: str, local: Path, expected: dict[str, Any] | None = None) -> None:
    """Download ``remote`` onto ``local`` atomically (a hidden temporary file renamed onto it); check the digest.

    Raises:
        DamagedObject: the download's size or SHA-256 is not the commit's (a changed or damaged object).
    """
    local.parent.mkdir(parents=True, exist_ok=True)
    partial = local.with_name(f".{local.name}.{os.getpid()}.download")
    try:
        fs.get_file(remote, str(partial))
        if expected is not None and (
            os.path.getsize(partial) != expected.get("size") or sha256_of(partial) != expected.get("sha256")
        ):
            raise DamagedObject(f"{remote} is not the object its commit names (size or SHA-256 differ)")
        os.replace(partial, local)
    finally:
        partial.unlink(missing_ok=True)


def read_json(fs: Any, remote: str) -> tuple[dict[str, Any] | None, Any]:
    """A small JSON object and its version tag (S3's ETag, else the bytes); ``(None, None)`` when absent."""
    try:
        data = fs.cat_file(remote)
    except FileNotFoundError:
        return None, None
    tag = fs.info(remote).get("ETag") if is_s3(fs) else data
    try:
        record = json.loads(data)
    except ValueError:
        return None, tag
    return (record if isinstance(record, dict) else None), tag


def create(fs: Any, remote: str, record: dict[str, Any]) -> Any | None:
    """Write ``record`` at ``remote`` only if nothing is there; its version tag, or ``None`` when something was."""
    data = json.dumps(record, sort_keys=True).encode()
    try:
        if is_s3(fs):
            fs.pipe_file(remote, data, mode="create")
        else:
            _parents(fs, remote)
            with fs.open(remote, "xb") as handle:  # O_EXCL on a local or mounted file system
                handle.write(data)
    except FileExistsError:
        return None
    return _tag_after_write(fs, remote, data)


def replace(fs: Any, remote: str, record: dict[str, Any], tag: Any) -> Any | None:
    """Overwrite ``remote`` with ``record`` only if it is still what was read (``tag``); the new tag, else ``None``."""
    data = json.dumps(record, sort_keys=True).encode()
    if is_s3(fs):
        try:
            fs.pipe_file(remote, data, IfMatch=tag)
        except OSError:  # 412 Precondition Failed (s3fs: EINVAL), or gone (FileNotFoundError)
            return None
        return _tag_after_write(fs, remote, data)
    try:
        if fs.cat_file(remote) != tag:
            return None
    except FileNotFoundError:
        return None
    fs.pipe_file(remote, data)
    return data


def _tag_after_write(fs: Any, remote: str, data: bytes) -> Any:
    if is_s3(fs):
        fs.invalidate_cache(remote)
        return fs.info(remote).get("ETag")
    return data


def remove(fs: Any, remote: str, recursive: bool = False) -> None:
    """Delete an object (or everything under a prefix); absent is fine."""
    with contextlib.suppress(FileNotFoundError):
        fs.rm(remote, recursive=recursive)


def listing(fs: Any, remote: str) -> list[str]:
    """The names directly under ``remote`` (empty when there is nothing)."""
    try:
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(remote, detail=False, refresh=True)]
    except FileNotFoundError:
        return []
