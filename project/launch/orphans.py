"""Nothing outlives its launcher: a rank ends when the process that started it (torchrun, Lightning, a layer) dies.

Re-parented to init, it would train on unsupervised, writing into the run directory while a requeued job trains there
too. The kernel signals it (``prctl(PR_SET_PDEATHSIG)``, Linux; elsewhere a thread polls ``os.getppid()``). SIGKILL,
not SIGTERM: the collective stop SIGTERM starts cannot be relied on with the launcher (perhaps the other ranks, or the
agent's store) gone; ``fit --resume auto`` continues from ``last.ckpt``. Standard library only: ``project.__main__``
calls :func:`die_with_launcher` before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence

PARENT_DEATH_SIGNAL = signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM  # when the launcher dies
WATCH_INTERVAL_S = 1.0  # seconds between two looks at the parent where prctl is not available (macOS)
_PR_SET_PDEATHSIG = 1


def die_with_launcher(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> None:
    """When an outside launcher started this process as one of its ranks, end it when that launcher dies."""
    parent = launcher_of(os.environ if environ is None else environ, sys.argv if argv is None else argv)
    if parent is not None:
        die_with_parent(parent)


def launcher_of(environ: Mapping[str, str], argv: Sequence[str]) -> int | None:
    """The process id of the launcher that started this process as a rank (its parent); ``None``: none did.

    torchrun sets TORCHELASTIC_RUN_ID; Lightning's children have LOCAL_RANK 1..N-1 and their parent's command line.
    """
    parent = os.getppid()
    if "TORCHELASTIC_RUN_ID" in environ:
        return parent
    local_rank = environ.get("LOCAL_RANK", "")
    if local_rank.isdigit() and int(local_rank) > 0 and _runs_command(parent, argv[1:]):
        return parent
    return None


def die_with_parent(parent: int) -> None:
    """From now on, end this process when ``parent`` (its parent now) dies; end it at once if it has already died."""
    if not _set_parent_death_signal(PARENT_DEATH_SIGNAL):
        _watch_parent(parent)
    if os.getppid() != parent:  # the parent ended before the signal was set up
        os._exit(1)


def finish_without_parent() -> None:
    """A stop is under way: let it finish if the launcher dies now (torchrun's agent does not wait on a 2nd signal)."""
    _set_parent_death_signal(0)


def _set_parent_death_signal(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)``; whether it took effect (Linux only)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum)) == 0
    return False


def _watch_parent(parent: int) -> None:
    """Poll ``os.getppid()`` in a daemon thread; end this process when the parent changes (it died)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)

    if sys.platform != "win32":  # Windows does not re-parent: getppid() would never change
        threading.Thread(target=watch, name="project-parent-watch", daemon=True).start()


def _runs_command(pid: int, args: Sequence[str]) -> bool:
    """Whether process ``pid``'s command line ends with ``args`` (``True`` where ``/proc`` cannot say)."""
    if not os.path.isdir("/proc/self"):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = [os.fsdecode(word) for word in cmdline.read().split(b"\0")[:-1]]
    except OSError:
        return False
    return len(words) > len(args) and words[len(words) - len(args) :] == list(args)
