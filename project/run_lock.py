"""One training per run directory: ``<run>/.training.lock``, held by rank 0 for the whole ``fit``.

A second training there would overwrite the first's checkpoints: it is refused, naming the holder (pid and host).
A POSIX record lock (``fcntl.lockf``) dies with its process, is not inherited by forked ones (DataLoader workers) and
works over NFS. A file system without locks (``ENOLCK``, ``EINVAL``: some Lustre mounts) trains without one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from project.errors import UserError
from project.run_store import Held, active

try:
    import fcntl
except ImportError:  # Windows: no POSIX locks; nothing is locked
    fcntl = None  # type: ignore[assignment]

#: The lock file, in the run directory (``logs/<name>/version_<n>``).
LOCK_NAME = ".training.lock"
_READ_WAIT_S = 2.0  # how long a refused run waits for the holder's pid to appear in a file it has just locked
_HELD = (errno.EACCES, errno.EAGAIN)  # what lockf raises when another process holds the lock


@dataclass
class TrainingLock:
    """The run directory's lock, held by this process (or nothing held: ``fd`` is ``None``)."""

    path: Path | None = None
    fd: int | None = None
    #: The run directory's (atime, mtime) before the lock file was made, and its mtime right after.
    before: tuple[int, int] | None = None
    mtime_after: int | None = None

    @classmethod
    def take(cls, run_dir: Path | str | None, hold: bool = True) -> TrainingLock | Held:
        """Lock ``run_dir`` for a ``fit`` (``hold``: rank 0), or take a URL store's lease; ``UserError`` if held."""
        if (in_store := active().hold(run_dir, hold)) is not None:
            return in_store
        if not hold or run_dir is None or fcntl is None or not Path(run_dir).is_dir():
            return cls()
        path = Path(run_dir) / LOCK_NAME
        before = _times(path.parent)
        for _ in range(10):  # the holder may remove the file between our open and our lock: open the new one
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # a read-only folder: the training fails on its own, and says why
                return cls()
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_holder(fd) if error.errno in _HELD else None
                os.close(fd)
                if error.errno not in _HELD:
                    return cls()  # no locks on this file system
                raise UserError(_refusal(Path(run_dir), holder)) from None
            if _same_file(fd, path):
                break
            os.close(fd)  # we locked a removed file; the next open finds the current one
        else:
            return cls()
        since = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        return cls(path, fd, before, _times(path.parent)[1])

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent). A directory nothing else changed gets its times back."""
        if self.fd is None or self.path is None:
            return
        fd, self.fd = self.fd, None
        try:
            unchanged = self.before is not None and _times(self.path.parent)[1] == self.mtime_after
            self.path.unlink()  # removed while locked: nobody locks this file again once we let go
            if unchanged and self.before is not None:
                os.utime(self.path.parent, ns=self.before)
        except OSError:
            pass  # already removed (a run refused before training is undone, lock file included)
        finally:
            os.close(fd)


def holder_of(run_dir: Path | str) -> dict | None:
    """What the lock file of ``run_dir`` says about its holder, if any (it may be stale: see :class:`TrainingLock`)."""
    try:
        text = (Path(run_dir) / LOCK_NAME).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


def _refusal(run_dir: Path, holder: dict | None) -> str:
    if holder is None:
        who, stop = "another process (it names no pid yet)", "stop it"
    else:
        pid, host = holder.get("pid", "?"), holder.get("host", "?")
        who = f"pid {pid} on host {host}, since {holder.get('since', '?')}"
        stop = f"stop it (`kill {pid}` on {host}: it saves and stops)"
    return (
        f"{run_dir} is training already ({who}); a second training there would overwrite its checkpoints and "
        f"events: wait for it to end, or {stop}, then run this command again"
    )


def _read_holder(fd: int) -> dict | None:
    """The holder's record; it writes it right after locking, so an empty file is read again for a moment."""
    deadline = time.monotonic() + _READ_WAIT_S
    while True:
        with contextlib.suppress(OSError, ValueError):
            if isinstance(record := json.loads(os.pread(fd, 4096, 0).decode()), dict):
                return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _times(folder: Path) -> tuple[int, int]:
    return (stat := folder.stat()).st_atime_ns, stat.st_mtime_ns
