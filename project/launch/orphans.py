"""Nothing outlives its launcher: a rank ends when the process that started it dies.

Three launchers start ranks as child processes: torchrun's agent (every worker), Lightning's launcher (rank 0
re-runs ``python -m project ...`` for ranks 1..N-1 with LOCAL_RANK set) and the template's early launcher
(the early layer forks ranks 1..N-1 from rank 0). When that parent dies (SIGKILL, a crash, a default
SIGUSR1), its children would otherwise be re-parented to init and train on unsupervised to the end, writing
``last.ckpt``, events and ``export/`` into the run directory while a requeued job trains in it too.

:func:`die_with_parent` asks the kernel to send :data:`PARENT_DEATH_SIGNAL` when the parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux), then checks that the parent is still the one it expected (it may have died
before the signal was set up). Elsewhere a daemon thread polls ``os.getppid()`` every
:data:`WATCH_INTERVAL_S` seconds (a re-parented process sees its parent change; on Windows it never does, so there
nothing is watched). :func:`die_with_launcher` decides, from the environment alone (standard library only: it
runs in ``project.__main__`` before anything heavy is imported), whether this process is a rank an outside launcher
started.

Which signal: SIGKILL, not SIGTERM. SIGTERM would run the worker's own stop handler
(:mod:`project.parallel.stop`), which agrees on a stop step with the other ranks and saves; but with the launcher
gone that cannot be relied on: the other ranks may be gone too (rank 0, under Lightning's launcher), the
rendezvous store the ranks agree over is torchrun's agent's own (``TORCHELASTIC_USE_AGENT_STORE``), and a
collective save would wait for missing ranks until its timeout, training on meanwhile while the requeued job
starts. The run's own ``last.ckpt`` (written every minute and at each epoch end) is what ``fit --resume auto``
continues from.
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

#: The signal the kernel sends a rank when its parent (the launcher) dies; see the module docstring for why.
PARENT_DEATH_SIGNAL = signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM
#: Seconds between two looks at the parent where ``prctl`` is not available (macOS).
WATCH_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


def die_with_launcher(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> None:
    """When an outside launcher started this process as one of its ranks, end it when that launcher dies."""
    parent = launcher_of(os.environ if environ is None else environ, sys.argv if argv is None else argv)
    if parent is not None:
        die_with_parent(parent)


def launcher_of(environ: Mapping[str, str], argv: Sequence[str]) -> int | None:
    """The process id of the launcher that started this process as a rank (its parent); ``None``: none did.

    - torchrun (and ``torch.distributed.launch``): TORCHELASTIC_RUN_ID is set in every worker, whose parent is
      the agent.
    - Lightning's launcher: LOCAL_RANK is set to 1..N-1, and the parent runs the same command line (rank 0 re-runs
      ``sys.executable -m project`` with its own arguments). The command line tells its children apart from
      ranks a user started by hand with LOCAL_RANK set (from a shell that may end before they do); where there
      is no ``/proc`` to read it, LOCAL_RANK alone decides, as it does for Lightning.

    A parent that died before this process got here cannot be told from init or a subreaper: torchrun's agent
    may itself be process 1 of a container. Python's start-up is that window (tens of milliseconds).
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
    """A stop is under way in this rank: let it finish if the launcher dies now (Linux; its grace period bounds it).

    torchrun's agent that got a second signal while its workers save their stop step ends without waiting for them;
    the rank no longer trains (it stops within 2 steps) and ends within ``parallel.stop_grace_s`` in any case.
    """
    _set_parent_death_signal(0)


def _set_parent_death_signal(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)``; whether it took effect (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
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
