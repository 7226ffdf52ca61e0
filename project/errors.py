"""User-facing errors: one line, the bad value, the rule and the fix; exit code 2, no traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")

#: Where a launcher puts this process's rank (Lightning's own list): torchrun and Lightning, SLURM's srun, LSF's jsrun.
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "LOCAL_RANK")
#: Exit code for bad input, the same that argparse/jsonargparse use for a bad command line.
USAGE_EXIT_CODE = 2
#: Called before a rank other than 0 reports its error. A rank forked with rank 0 (the early layer, project/extras/)
#: registers a wait here: it fails before the ranks met at the same mistake as rank 0, which reports it once.
BEFORE_RANK_REPORT: list[Callable[[], None]] = []


class UserError(Exception):
    """A mistake in what the user asked for; reported as one line, never as a traceback."""


class RunFailure(RuntimeError):
    """A fault while running (a rank missing a barrier, a non-finite loss): one line, exit code 1."""


class Preempted(RunFailure):
    """Stopped by a signal at a step every rank agreed on and saved: exit code 75 (``EX_TEMPFAIL``), resumable."""

    exit_code = 75
    #: Every rank stops alike: rank 0 says it, the others end with the same code quietly.
    said_by_rank_zero = True


class RankFailure(RunFailure):
    """Another rank died, hung or failed: named in one line (:func:`project.parallel.failures.explain_rank_failure`)."""


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, its runs of whitespace made one space (else its type)."""
    lines = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def debug_enabled() -> bool:
    """Whether tracebacks should be shown (``PROJECT_DEBUG=1``)."""
    return os.environ.get("PROJECT_DEBUG", "") not in ("", "0", "false")


def exit_with(error: BaseException, code: int = USAGE_EXIT_CODE) -> NoReturn:
    """Print ``error: <message>`` (its lines folded into one) on stderr and exit with ``code``."""
    if debug_enabled():
        raise error
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    rank = next((os.environ[key] for key in RANK_VARIABLES if os.environ.get(key)), None)
    prefix = f"[rank {rank}] " if rank not in (None, "0") else ""
    if prefix:
        if getattr(error, "said_by_rank_zero", False):
            raise SystemExit(code)
        for hook in BEFORE_RANK_REPORT:
            hook()
    print(f"{prefix}error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def run_reporting_user_errors(fn: Callable[[], T]) -> T:
    """Run ``fn``; a :class:`UserError` becomes one line and exit code 2, a :class:`RunFailure` exit code 1."""
    try:
        return fn()
    except UserError as error:
        exit_with(error)
    except RunFailure as error:
        exit_with(error, code=getattr(error, "exit_code", 1))
