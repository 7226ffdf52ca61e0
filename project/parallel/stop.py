"""The ranks' agreement on a stop step, out of band: over the rendezvous store, never a collective per step.

A signal may reach one rank, some, or all, at different steps. The rank that notes one proposes a stop step, the
step it had completed plus :data:`STEPS_AHEAD`, on the rendezvous store every process group already has (a
key-value server on ``MASTER_ADDR:MASTER_PORT``), with compare-and-set: the first proposal wins. Every rank has a
thread blocked on that key from the start; when the key appears, the thread records the agreed step, which the
training loop reads after each step (one read of an int). The ranks are never more than a step apart (the gradient
all-reduce holds them together), so each learns of the stop before it reaches it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta

import lightning as L
import torch.distributed as dist

#: A proposal stops the ranks this many optimizer steps after the step its rank had completed.
STEPS_AHEAD = 2
#: The key's value once training is over: no stop, the watchers end.
DONE = "done"
#: Seconds of one wait of the watcher. :meth:`StopChannel.close` ends it at once by setting the key (every path out
#: of a fit closes the channel); the slices only bound a watcher whose close could not reach the store. Each slice
#: that times out makes torch's store client print a warning, so they are long.
WAIT_S = 3600.0


class StopChannel:
    """The ranks' agreement on a stop step, over the rendezvous store (no collective after :meth:`open`)."""

    def __init__(self, key: str, on_agreed: Callable[[str], None] | None = None) -> None:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        # Two clients: a store client holds its lock while it waits, so the proposer needs a connection of its own.
        timeout = timedelta(days=7)
        self._waiting = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
        # A proposal or the closing mark is one quick request; a store that went away fails it within seconds.
        self._proposing = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
        )
        self.key = key
        self.agreed: tuple[int, str] | None = None
        self._on_agreed = on_agreed  # e.g. start this rank's grace period: it got no signal of its own
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="project-stop-watch", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a run that ends without Lightning's hooks (an error outside fit)

    @classmethod
    def open(cls, trainer: L.Trainer, on_agreed: Callable[[str], None] | None = None) -> StopChannel:
        """A channel for this run attempt: its key is new, so a restarted job never reads an old stop (collective).

        ``on_agreed`` is called in the watcher's thread with the proposal's reason once a stop is agreed.
        """
        token = trainer.strategy.broadcast(uuid.uuid4().hex if trainer.is_global_zero else None, src=0)
        return cls(f"project/stop/{token}", on_agreed)

    def propose(self, step: int, why: str) -> None:
        """Propose stopping after ``step`` (the first proposal of any rank wins); callable from any thread."""
        self._proposing.compare_set(self.key, "", f"{step} {why}")

    def close(self) -> None:
        """Training is over (or failed): end this rank's watcher before the store's host, rank 0, can go away.

        Idempotent; never raises (in a failed run the store may be gone already).
        """
        if self._closing.is_set():
            return
        self._closing.set()
        with contextlib.suppress(Exception):
            self._proposing.compare_set(self.key, "", DONE)  # the others' watchers end at once too
        self._thread.join(timeout=10)

    def _wait(self) -> None:
        # A watcher must end before the process does (a thread blocked inside the store client at exit aborts the
        # process): close() sets the key, and the loop also looks at _closing between slices.
        while not self._closing.is_set():
            try:
                self._waiting.wait([self.key], timedelta(seconds=WAIT_S))
                value = self._waiting.get(self.key).decode()
            except dist.DistStoreError:  # the wait timed out: look again
                continue
            except Exception:  # the store went away: the others failed (said elsewhere)
                return
            if value != DONE:
                step, why = value.split(" ", 1)
                self.agreed = (int(step), why)
                if self._on_agreed is not None:
                    self._on_agreed(why)
            return
