"""The run's records beside its checkpoints in the store: config.yaml, plan.json, events, export/, predictions.

Rank 0 writes them in its scratch cache as on a local disk; they go up after each checkpoint commit (so a killed
run's store holds the records of its last checkpoint) and when the command ends. A file goes up again only when
its size or modification time changed. ``checkpoints/`` (committed on its own), hidden files (locks, temporary
halves of writes) and nothing outside the run directory go up. ``config.yaml`` names the store's URL where the
cache holds the scratch folder, so the record says where the run really is.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from project.extras.storage import objects
from project.extras.storage.location import Store

# (store path) -> (size, mtime_ns) of what this process uploaded last.
_UPLOADED: dict[str, tuple[int, int]] = {}
# Records are synced from the checkpoint writer's thread and from the main thread at the end.
_LOCK = threading.Lock()


def sync(store: Store, run_dir: Path) -> list[str]:
    """Upload the records of ``run_dir`` (a run folder in the scratch cache) that changed; their store paths."""
    remote_dir = store.remote(run_dir)
    if remote_dir is None or not run_dir.is_dir():
        return []
    sent = []
    with _LOCK:
        for path in sorted(run_dir.rglob("*")):
            relative = path.relative_to(run_dir)
            if not path.is_file() or relative.parts[0] == "checkpoints" or _hidden(relative):
                continue
            stat = path.stat()
            remote = f"{remote_dir}/{relative.as_posix()}"
            if _UPLOADED.get(remote) == (stat.st_size, stat.st_mtime_ns):
                continue
            if relative.as_posix() == "config.yaml":
                objects.write(store.fs, remote, _with_url(store, path.read_bytes()))
            else:
                objects.put(store.fs, path, remote)
            _UPLOADED[remote] = (stat.st_size, stat.st_mtime_ns)
            sent.append(remote)
    return sent


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _with_url(store: Store, text: bytes) -> bytes:
    """A config.yaml whose logger ``save_dir`` is the scratch folder, as the URL it caches."""
    scratch = os.fspath(store.scratch)
    lines = []
    for line in text.decode().splitlines(keepends=True):
        key, _, value = line.partition("save_dir:")
        if _ and value.strip().strip("'\"") in (scratch, os.path.abspath(scratch)):
            line = f"{key}save_dir: {store.url}\n"
        lines.append(line)
    return "".join(lines).encode()
