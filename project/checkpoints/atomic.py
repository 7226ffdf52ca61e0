"""Atomic file writes: a temporary file in the same folder, fsync, then rename; a kill leaves at most a ``*.tmp``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(handle)`` on a temporary file next to ``path``; on success it replaces ``path`` in one rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates owner-only files; give the result the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o666 & ~umask)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` that never leaves a truncated file at ``path``."""
    atomic_write(path, lambda handle: torch.save(obj, handle))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))
