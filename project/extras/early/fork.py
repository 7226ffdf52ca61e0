"""Fork ranks 1..N-1 of a one-machine CPU run right after the imports, so that no rank waits for another's start-up.

Under Lightning's launcher rank 0 starts the others when it reaches ``trainer.fit``, and each of them then
spends seconds importing torch and Lightning: on 2 cores, 2 processes took twice as long as one to reach their
first step, 4 processes four times. Here :func:`ranks_started_at_once` reads the layout from the command line
(:mod:`.preparse`) and, when it is N CPU processes on this machine, forks N-1 ranks from the
imported interpreter at once: one import for all of them, and every rank parses and builds at the same time.

Each forked rank gets what Lightning's launcher gives its children (LOCAL_RANK, NODE_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), its rank in ``rank_zero_only`` (Lightning read it at import, in rank 0), and dies
with rank 0 (the parent-death signal). Rank 0 sets the same variables once its plan agrees
(:meth:`.ranks.StartedRanks.confirm`, through :func:`project.launch.ranks.confirm_started_ranks`), so
Lightning starts no process again. Forking after
the imports is safe because nothing has run yet: no thread pool of torch's, no CUDA, no process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from project import errors
from project.extras.early.child import PARENT_ENV, wait_for_rank_zero
from project.extras.early.preparse import processes_to_start
from project.extras.early.ranks import ForkedRank, StartedRanks, watch
from project.launch.orphans import die_with_parent
from project.launch.ranks import started_ranks

#: What the watcher's line says to do once the cause of a dead rank is fixed, by command.
_THEN = {"fit": "then resume with `fit --ckpt_path last`", "check": "then run check again"}


@contextlib.contextmanager
def ranks_started_at_once(argv: Sequence[str]) -> Iterator[None]:
    """Run the body (the command) in rank 0 and in every rank forked for it; a no-op when nothing is forked.

    In rank 0: when the body fails the forked ranks are stopped; when it succeeds they are waited for. In a forked
    rank: an unexpected error before the ranks met waits for rank 0 to stop this rank, so it is reported once.
    """
    count = processes_to_start(argv)
    started = _fork_ranks(count, argv[0]) if count is not None else None
    if started is None:  # a forked rank, or nothing forked
        try:
            yield
        except Exception:
            wait_for_rank_zero()  # a no-op outside a forked rank
            raise
        return
    try:
        yield
    except BaseException as error:
        if isinstance(error, SystemExit) and error.code in (None, 0):  # e.g. Lightning's stop on SIGTERM
            started.finish()
        else:
            started.stop()
        raise
    started.finish()


def _fork_ranks(count: int, command: str) -> StartedRanks | None:
    """Fork ranks 1..count-1; in rank 0 their registry, in each forked rank (and when fork fails) ``None``."""
    environment = {"MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"), "NODE_RANK": "0"}
    environment["WORLD_SIZE"] = str(count)
    keep = None
    if "MASTER_PORT" in os.environ:
        environment["MASTER_PORT"] = os.environ["MASTER_PORT"]
    else:
        keep = _hold_free_port()
        environment["MASTER_PORT"] = str(keep.getsockname()[1])
    parent = os.getpid()
    ranks: list[ForkedRank] = []
    for stream in (sys.stdout, sys.stderr):  # or the children would write rank 0's buffered output again
        stream.flush()
    for local_rank in range(1, count):
        try:
            with warnings.catch_warnings():
                # Python >= 3.12 warns about forking with threads; the only ones here are the BLAS libraries' idle
                # pools, which reset themselves in the child (their fork handlers), as for DataLoader workers.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # out of processes or memory: stop the forked ones, Lightning's launcher starts them
            for rank in ranks:
                rank.kill()
                rank.wait(timeout=5.0)
            if keep is not None:
                keep.close()
            return None
        if pid == 0:
            _become_rank(local_rank, parent, {**environment, "LOCAL_RANK": str(local_rank)}, keep)
            return None
        ranks.append(ForkedRank(pid, local_rank))
    started = StartedRanks(ranks, environment, _THEN.get(command, "then run the command again"), keep)
    watch(started)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _forward_sigterm)
    return started


def _hold_free_port() -> socket.socket:
    """A socket bound to a free port, held until rank 0's rendezvous store listens on it.

    The store binds with SO_REUSEADDR and a socket that only binds does not conflict with it, while no other
    process is given the port meanwhile (Lightning picks a free port and releases it, which works there because
    it listens a moment later; here the ranks start up for seconds first).
    """
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("", 0))
    return held


def _become_rank(local_rank: int, parent: int, environment: dict[str, str], keep: Any) -> None:
    """Turn this forked process into rank ``local_rank``, as Lightning's launcher would have started it."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only  # imported already (fork follows the imports)

    if keep is not None:
        keep.close()
    os.environ.update(environment)
    os.environ[PARENT_ENV] = str(parent)
    errors.BEFORE_RANK_REPORT.append(wait_for_rank_zero)  # a mistake rank 0 makes too is reported once, by rank 0
    # Lightning set this from the environment when rank 0 imported it; this rank's own import would read LOCAL_RANK.
    rank_zero_only.rank = local_rank
    # Die with rank 0 (killed, or crashed) instead of waiting at a collective until the timeout.
    die_with_parent(parent)


def _forward_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM to rank 0 reaches the forked ranks too, as Lightning's launcher forwards it to its children.

    During ``fit`` Lightning's handler runs with this one (it keeps the handler it found) and goes on to stop
    training in every rank; outside it this process ends as SIGTERM ends it by default.
    """
    for rank in started_ranks():
        rank.send_signal(signal.SIGTERM)
    if signal.getsignal(signal.SIGTERM) is _forward_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
