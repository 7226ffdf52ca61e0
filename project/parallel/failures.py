"""Say which rank failed when a multi-process run breaks, instead of a gloo/nccl traceback.

When one rank dies (killed, out of memory, crashed) the others learn it in their next collective,
from an error that names a socket, not a rank ("Connection reset by peer"); a rank that is stuck
makes the others' collective fail after ``parallel.timeout_s`` ("Timed out"). Rank 0 under
Lightning's own launcher started the other ranks, so it can tell exactly which one died and how;
any other rank names its peer when there is only one, and otherwise leaves that to the launcher
(torchrun's report names the failed rank and its exit code).
"""

from __future__ import annotations

import importlib
import re
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.multiprocessing as mp

from project.errors import RunFailure, UserError
from project.lightning_private import launched_processes

if TYPE_CHECKING:
    import lightning as L

# How long rank 0 waits for a child that broke the connection to be reaped, so its exit code is known.
_REAP_WAIT_S = 3.0
# Error texts of gloo, nccl and the TCP store when a peer went away or a collective never completed.
_LOST_PEER = ("connection reset", "connection closed", "connection refused", "broken pipe", "socket closed")
_TIMED_OUT = ("timed out", "timeout")


class RankFailure(RunFailure):
    """A rank died or a collective did not complete: one line naming the rank, exit code 1."""


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _gist(error: BaseException) -> str:
    """The backend's own words without its source location: "[pair.cc:534] Connection closed by peer ..."."""
    line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    line = re.sub(r"^\[[^\]]*\]\s*", "", line)
    return line.split(". ")[0][:160]


def _failed_children(strategy: Any, wait_s: float) -> list[tuple[int, subprocess.Popen]]:
    """(local rank, process) of the ranks this process started that ended with an error."""
    procs = launched_processes(strategy)
    deadline = time.monotonic() + wait_s
    while True:
        failed = [(i + 1, p) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed or not procs or time.monotonic() >= deadline:
            return failed
        time.sleep(0.05)


def explain_rank_failure(
    error: BaseException,
    trainer: L.Trainer | None,
    timeout_s: float | None,
    timeout_name: str = "parallel.timeout_s",
    then: str = "then resume with `fit --ckpt_path last`",
) -> RankFailure | None:
    """A one-line :class:`RankFailure` for ``error`` if it is a lost or stuck rank, else ``None``.

    Call it in the rank that caught ``error``, before its launcher's children are stopped, so that a
    child that died first is told apart from the ones stopped afterwards. ``timeout_name`` is the
    setting that holds ``timeout_s``; ``then`` is what to do once the cause is fixed.
    """
    world_size = getattr(trainer, "world_size", 1) if trainer is not None else 1
    if world_size <= 1 or isinstance(error, (RunFailure, UserError)) or not isinstance(error, RuntimeError):
        return None
    text = str(error).lower()
    lost, timed_out = any(s in text for s in _LOST_PEER), any(s in text for s in _TIMED_OUT)
    rank = trainer.global_rank
    # A child that broke the connection is dead, or about to be reaped; a stuck one never exits.
    failed = _failed_children(trainer.strategy, _REAP_WAIT_S if lost else 0.0)
    resume = then
    if failed:
        first = trainer.node_rank * trainer.num_devices
        names = ", ".join(f"rank {first + local} (pid {p.pid}) {_how_it_ended(p.returncode)}" for local, p in failed)
        return RankFailure(
            f"{names}; rank {rank} stopped the other ranks of this run. Read that rank's output above "
            f"(a SIGKILL nobody sent is often the out-of-memory killer: see `dmesg`), {resume}"
        )
    if not (lost or timed_out or isinstance(error, dist.DistError)):
        return None
    peer = f"rank {1 - rank}" if world_size == 2 else "another rank (the launcher's report names it)"
    detail = _gist(error)
    if timed_out and not lost:
        limit = f"{timeout_name}={timeout_s:g} s" if timeout_s is not None else "the process group's timeout"
        return RankFailure(
            f"rank {rank}: a collective did not complete within {limit}; {peer} is stuck or far behind "
            f"({detail}). Find what it waits for (e.g. `py-spy dump --pid PID`), or raise {timeout_name} "
            f"if ranks legitimately do long uneven work, {resume}"
        )
    return RankFailure(
        f"rank {rank} lost {peer} during a collective: that rank died or was killed ({detail}). "
        f"Read its output or the launcher's report for why, {resume}"
    )


def error_from_worker(error: BaseException) -> BaseException | None:
    """The template's own error raised in a forked or spawned worker (``scenario: fork``), as that error again.

    ``torch.multiprocessing`` hands the main process a ``ProcessRaisedException`` holding the worker's
    traceback as text; its last line is ``module.Class: message``.
    """
    if not isinstance(error, mp.ProcessRaisedException):
        return None
    found = re.match(r"^([\w.]+)\.(\w+): (.*)$", str(error).strip().splitlines()[-1])
    if found is None:
        return None
    module, name, message = found.groups()
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return cls(message) if isinstance(cls, type) and issubclass(cls, (UserError, RunFailure)) else None
