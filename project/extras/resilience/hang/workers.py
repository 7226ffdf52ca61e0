"""The stacks of this rank's DataLoader worker processes, taken by faulthandler on a signal only we send.

A worker forked from the rank inherits the rank's faulthandler registration (the signal's handler and the file
it writes to), so sending it :data:`STACKS_SIGNAL` makes it write its Python stack into the rank's unlinked
temporary file, with no code in the worker. A process that does not catch the signal (a worker of the ``spawn``
start method, anything else) is never sent it: its default action would end it.

The same registration makes each process forked from the rank end with it (``prctl(PR_SET_PDEATHSIG)``): a worker
stuck in a dataset's ``__getitem__`` never looks whether its rank is alive, and would outlive a rank that was
stopped, unsupervised, for as long as it is stuck.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from project.extras.resilience.hang.records import locate, own_frames
from project.launch.orphans import die_with_parent

#: A real-time signal nobody else sends (SIGUSR1/2 are schedulers' and users').
STACKS_SIGNAL = signal.SIGRTMIN + 6
#: Seconds a worker gets to write its stack.
WRITE_WAIT_S = 0.5
_FORKS_DIE_WITH_RANK = False
_FRAME = re.compile(r'File "(.*)", line (\d+) in (\S+)')


class WorkerStacks:
    """Registered once per rank before its loaders start workers; :meth:`take` asks each live worker."""

    def __init__(self) -> None:
        # Unlinked: nothing is left behind, whatever happens; open while the rank lives (its workers write to it).
        self._file = tempfile.TemporaryFile()  # noqa: SIM115
        faulthandler.register(STACKS_SIGNAL, file=self._file, all_threads=True, chain=False)
        global _FORKS_DIE_WITH_RANK
        if not _FORKS_DIE_WITH_RANK:  # once per process: a hook cannot be unregistered
            os.register_at_fork(after_in_child=lambda: die_with_parent(os.getppid()))
            _FORKS_DIE_WITH_RANK = True

    def take(self, skip: set[int]) -> list[dict[str, Any]]:
        """The stack of each child of this process that catches the signal (``skip``: ranks it started)."""
        fd = self._file.fileno()
        taken = []
        for pid in sorted(_children(os.getpid()) - skip):
            if not _catches(pid, STACKS_SIGNAL):
                continue
            start = os.lseek(fd, 0, os.SEEK_END)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, STACKS_SIGNAL)
            deadline = time.monotonic() + WRITE_WAIT_S
            while os.fstat(fd).st_size == start and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.05)  # the rest of its lines
            text = os.pread(fd, os.fstat(fd).st_size - start, start).decode("utf-8", "replace").strip()
            if text:
                taken.append({"pid": pid, "text": text, "where": _where(text)})
        return taken


def _where(text: str) -> str | None:
    """Where a faulthandler dump's signalled (main) thread is, if in the run's own code (a dataset, a collate)."""
    blocks = text.split("\n\n")
    main = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0])
    frames = [[m.group(1), int(m.group(2)), m.group(3)] for m in map(_FRAME.search, main.splitlines()) if m]
    frames.reverse()  # faulthandler lists the most recent call first
    return locate(frames) if own_frames(frames) else None


def _children(pid: int) -> set[int]:
    """Process ids whose parent is ``pid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    found = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M)
    return bool(found and int(found.group(1), 16) >> (int(signum) - 1) & 1)
