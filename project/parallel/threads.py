"""CPU threads per process: the machine's cores shared among the processes of one node, never oversubscribed.

torch gives each process a thread per core, so N processes on C cores run N x C threads (a 2-core digits run: 76-116 s
instead of 12 s). Each rank takes ``cores // processes`` unless ``parallel.cpu_threads`` or ``OMP_NUM_THREADS`` says.
"""

from __future__ import annotations

import os
import sys

import torch

from project.errors import UserError


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a scheduler such as SLURM narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_process(processes: int, cores: int, asked: int | None) -> int:
    """Intra-op threads for each of ``processes`` on ``cores``: ``asked`` (at least 1), else an even share."""
    if asked is not None and asked < 1:
        raise UserError(f"parallel.cpu_threads={asked} must be >= 1 (or null: the cores shared among the processes)")
    return asked if asked is not None else max(1, cores // max(1, processes))


def oversubscription(processes: int, cores: int) -> str | None:
    """A one-line warning when more processes than cores run on this node; ``None`` when they fit."""
    if processes <= cores:
        return None
    return (
        f"warning: {processes} processes on {cores} CPU cores: they take turns on the cores, so each step waits; "
        f"use parallel.devices <= {cores} on this machine (the results do not depend on the process count)"
    )


def apply_cpu_threads(processes: int, asked: int | None, rank: int) -> None:
    """Set this CPU process's intra-op threads (an even share of the cores) and warn once on oversubscription."""
    cores = available_cores()
    if asked is not None or "OMP_NUM_THREADS" not in os.environ:  # a user's OMP_NUM_THREADS stands
        torch.set_num_threads(threads_per_process(processes, cores, asked))
    if rank == 0 and (warning := oversubscription(processes, cores)) is not None:
        sys.stderr.write(warning + "\n")
