"""In a rank that :mod:`.fork` forked: stay quiet about a mistake rank 0 reports too.

Before the ranks meet (no process group yet) every rank parses the same command line and builds the same
objects, so a mistake in them stops every rank at the same point. Rank 0 says it in one line and stops the
others; under Lightning's launcher the others had not even started. A forked rank that fails there waits for
rank 0 to stop it, and reports its error only if rank 0 does not (a mistake only this rank made). Imports
nothing beyond the standard library: a forked rank registers it with :data:`project.errors.BEFORE_RANK_REPORT`.
"""

from __future__ import annotations

import os
import sys
import time

#: Set in each forked rank to the process id of rank 0, which started it.
PARENT_ENV = "PROJECT_EARLY_PARENT"
#: Seconds a forked rank waits for rank 0 to stop it before it reports its own error (it started with rank 0
#: and runs the same code, so rank 0 reaches the same mistake within a few seconds even on a loaded machine).
WAIT_FOR_RANK_ZERO_S = 20.0


def started_by() -> int | None:
    """The process id of rank 0 when this process is a rank it forked; ``None`` otherwise."""
    parent = os.environ.get(PARENT_ENV, "")
    return int(parent) if parent.isdigit() else None


def ranks_have_met() -> bool:
    """Whether this process joined the process group (torch is not imported for the question)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def wait_for_rank_zero(limit_s: float = WAIT_FOR_RANK_ZERO_S) -> None:
    """In a forked rank that failed before the ranks met, wait for rank 0 to stop it (up to ``limit_s``).

    Returns at once in any other process, and when rank 0 has gone (then nobody else reports).
    """
    parent = started_by()
    if parent is None or os.getpid() == parent or ranks_have_met():
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.05)
