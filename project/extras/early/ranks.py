"""The ranks rank 0 forked at start-up (:mod:`.fork`): watched, stopped, finished, confirmed against the plan.

They are registered with the core (:mod:`project.launch.ranks`), whose failure handling lists them beside the
processes Lightning's launcher starts, so a rank that dies is named and the others are stopped exactly as there. A
watcher replaces Lightning's process observer (which only runs for its own launcher): a rank that dies while rank 0
is not in a collective (still building, or waiting at the rendezvous) is named in one line, the others are stopped,
and the run ends with exit code 1 instead of waiting for the process group's timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from project.errors import Preempted, UserError
from project.launch import stop_signals
from project.launch.ranks import failure_note, how_it_ended, register

#: Seconds rank 0's own failure handling gets to name a dead rank first (it sees the lost peer in its next
#: collective, at once); after them the watcher names it and ends the run.
REPORT_AFTER_S = 5.0
#: Seconds the other ranks get to finish after rank 0 finished successfully (they leave the same final barrier).
FINISH_WAIT_S = 60.0
_POLL_S = 0.1


class ForkedRank:
    """A rank forked from this process, with the part of ``subprocess.Popen`` the failure reports use."""

    def __init__(self, pid: int, local_rank: int) -> None:
        self.pid = pid
        self.local_rank = local_rank
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the watcher and the main thread both poll

    def poll(self) -> int | None:
        """The exit code (negative: the signal that killed it) once it ended, reaping it; ``None`` while it runs."""
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else: its code is lost, as Popen says then
                    pid, status = self.pid, 0
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code, waiting up to ``timeout`` seconds (``None`` if it still runs then)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless it ended (an unreaped child keeps its pid, so the signal never hits another)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL it."""
        self.send_signal(signal.SIGKILL)


@dataclass
class StartedRanks:
    """Ranks 1..N-1 of this machine, forked by rank 0, and what rank 0 sets once the plan agrees."""

    ranks: list[ForkedRank]
    environment: dict[str, str]
    then: str
    keep: Any = None  # the socket that holds MASTER_PORT until the rendezvous store takes it
    ending: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def world_size(self) -> int:
        """All ranks, rank 0 included."""
        return len(self.ranks) + 1

    def stop(self) -> None:
        """SIGKILL the forked ranks and reap them (rank 0 failed, or was refused)."""
        with self.lock:  # a watcher reporting a death finishes first (and ends the process)
            self.ending = True
        for rank in self.ranks:
            rank.kill()
        for rank in self.ranks:
            rank.wait(timeout=5.0)

    def finish(self) -> None:
        """After rank 0 succeeded: let the other ranks end (they passed the same final barrier), then stop any left."""
        with self.lock:
            self.ending = True
        deadline = time.monotonic() + FINISH_WAIT_S
        for rank in self.ranks:
            if rank.wait(timeout=max(0.0, deadline - time.monotonic())) is None:
                sys.stderr.write(f"note: rank {rank.local_rank} (pid {rank.pid}) still ran {FINISH_WAIT_S:g} s after ")
                sys.stderr.write("rank 0 finished; it was stopped\n")
                rank.kill()
                rank.wait(timeout=5.0)

    def confirm(self, plan: Any) -> None:
        """Check the forked ranks against rank 0's resolved plan, then let Lightning treat them as started outside.

        Called once the plan is resolved (``plan`` is ``None`` when the ``parallel`` section is null). Sets
        LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT only now, so the plan reads the environment
        Lightning's launcher would leave (its LOCAL_RANK note stays away); with LOCAL_RANK set, Lightning's
        environment says the processes are created externally and starts none.

        Raises:
            UserError: the plan has another number of processes on this machine than were started.
        """
        per_node = None if plan is None else (len(plan.devices) if isinstance(plan.devices, list) else plan.devices)
        if plan is None or per_node != self.world_size or plan.num_nodes != 1 or plan.launcher != "lightning":
            self.stop()
            layout = "no parallel section" if plan is None else f"{per_node} process(es) per node x {plan.num_nodes}"
            raise UserError(
                f"{self.world_size} processes were started at once from the command line and config files, but the "
                f"parsed config resolves to {layout} (launcher {getattr(plan, 'launcher', 'none')}); the quick read "
                "of the parallel section disagrees with the parser, which is a bug: run with PROJECT_EARLY_LAUNCH=0 "
                "(Lightning's launcher then starts the processes) and report the command line"
            )
        os.environ.update(self.environment, LOCAL_RANK="0")


def watch(started: StartedRanks) -> None:
    """Register ``started`` with the core and start watching them."""
    register(started)
    threading.Thread(target=_watch, args=(started,), name="early-ranks-watcher", daemon=True).start()


def _watch(started: StartedRanks) -> None:
    """Name a rank that failed while rank 0 did not notice, stop the others and end the run (exit code 1, or 75)."""
    failed_at: float | None = None
    while not started.ending:
        failed = [rank for rank in started.ranks if rank.poll() not in (None, 0)]
        if failed and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at >= REPORT_AFTER_S:
            with started.lock:
                if started.ending:  # rank 0's own handling named it and stops the others
                    return
                code = _report(failed, started.then)
                if code is None:  # this rank is stopping too: its own stop ends it, within the grace
                    failed_at = None
                    continue
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                for rank in started.ranks:
                    rank.kill()
                for rank in started.ranks:
                    rank.wait(timeout=5.0)
                os._exit(code)  # rank 0 may be blocked in the rendezvous until the timeout: end it here
        time.sleep(_POLL_S)


def _report(failed: list[ForkedRank], then: str) -> int | None:
    """Say how the ``failed`` ranks ended, in one line; the exit code for it (``None``: say nothing yet).

    Ranks that ended with exit code 75 stopped on a signal (before training, or a stop that ran out of its grace):
    the run ends with 75 as theirs did, and nobody is blamed for it.
    """
    if all(rank.returncode == Preempted.exit_code for rank in failed):
        if stop_signals.stopping():
            return None
        names = ", ".join(f"rank {r.local_rank} (pid {r.pid})" for r in failed)
        sys.stderr.write(f"error: {stop_signals.peer_stopped(names)}\n")
        stop_signals.undo_if_untrained()
        return Preempted.exit_code
    names = ", ".join(f"rank {r.local_rank} (pid {r.pid}) {how_it_ended(r.returncode or 0)}" for r in failed)
    note = failure_note()
    if note is not None:  # the hang report: the rank that ended the run is not the one to blame
        sys.stderr.write(f"error: {note}; {names} at its timeout, and rank 0 stopped the other ranks, {then}\n")
        return 1
    sys.stderr.write(
        f"error: {names}; rank 0 stopped the other ranks of this run. Read that rank's output above (a "
        f"SIGKILL nobody sent is often the out-of-memory killer: see `dmesg`), {then}\n"
    )
    return 1
