"""Ranks 1..N-1 that this process started itself, outside Lightning's launcher (the early layer forks CPU ranks).

Listed beside Lightning's own (:mod:`project.lightning_private`); without such a layer every function is a no-op.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, Protocol


class RankProcess(Protocol):
    """A started rank, with the part of ``subprocess.Popen`` the failure reports use (and its local rank)."""

    pid: int
    local_rank: int
    returncode: int | None

    def poll(self) -> int | None:
        """The exit code once it ended; ``None`` while it runs."""

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless it ended."""

    def kill(self) -> None:
        """SIGKILL it."""


class StartedRanks(Protocol):
    """What a layer that started the ranks registers."""

    ranks: list[Any]

    def stop(self) -> None:
        """SIGKILL the ranks and reap them (this rank failed, or was refused)."""

    def confirm(self, plan: Any) -> None:
        """Check the ranks against the resolved plan (``None``: no ``parallel`` section)."""


_STARTED: StartedRanks | None = None
_FAILURE_NOTE: Callable[[], str | None] | None = None


def register(started: StartedRanks) -> None:
    """Make ``started`` the ranks this process started."""
    global _STARTED
    _STARTED = started


def started_ranks() -> list[RankProcess]:
    """The ranks this process started itself (none in any other process, and none without such a layer)."""
    return list(_STARTED.ranks) if _STARTED is not None else []


def stop_started_ranks() -> None:
    """SIGKILL the ranks this process started and reap them (rank 0 failed, or was refused)."""
    if _STARTED is not None:
        _STARTED.stop()


def confirm_started_ranks(plan: Any) -> None:
    """Check the started ranks against rank 0's resolved plan (``None``: ``parallel: null``); a UserError if off."""
    if _STARTED is not None:
        _STARTED.confirm(plan)


def explain_failures_with(note: Callable[[], str | None]) -> None:
    """Have a watcher of the started ranks say ``note()`` (if not ``None``) over "rank N exited" (a hang report)."""
    global _FAILURE_NOTE
    _FAILURE_NOTE = note


def failure_note() -> str | None:
    """What :func:`explain_failures_with` says now (``None``: nothing to add)."""
    return _FAILURE_NOTE() if _FAILURE_NOTE is not None else None


def how_it_ended(code: int) -> str:
    """How a process with exit status ``code`` ended: ``was killed by SIGKILL``, ``exited with code 3``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
