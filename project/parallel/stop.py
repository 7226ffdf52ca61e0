"""The ranks' agreement on a stop step, out of band: over the rendezvous store, never a collective per step.

The rank a signal reaches proposes by compare-and-set (the first proposal wins) to stop :data:`STEPS_AHEAD` steps on;
every rank's thread blocked on that key records it, and the loop reads it after each step. The gradient all-reduce
keeps the ranks within a step, so each learns of the stop before it reaches it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta

import lightning as L
import torch.distributed as dist

from project.parallel.collectives import store_client

#: A proposal stops the ranks this many optimizer steps after the step its rank had completed.
STEPS_AHEAD = 2
#: The key's value once training is over: no stop, the watchers end.
DONE = "done"
#: Seconds of one wait of the watcher: :meth:`StopChannel.close` ends it at once by setting the key; the slices only
#: bound a watcher whose close could not reach the store, and each that times out prints a warning, so they are long.
WAIT_S = 3600.0


class StopChannel:
    """The ranks' agreement on a stop step over the store; ``on_agreed(why)`` runs in the watcher's thread."""

    def __init__(self, key: str, on_agreed: Callable[[str], None] | None = None) -> None:
        # Two clients: a client holds its lock while it waits, so the proposer needs its own. A proposal or the
        # closing mark is one quick request: a store that went away fails it within seconds.
        self._waiting, self._proposing = store_client(timedelta(days=7).total_seconds()), store_client(10)
        self.key = key
        self.agreed: tuple[int, str] | None = None
        self._on_agreed = on_agreed  # e.g. start this rank's grace period: it got no signal of its own
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="project-stop-watch", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a run that ends without Lightning's hooks (an error outside fit)

    @classmethod
    def open(cls, trainer: L.Trainer, on_agreed: Callable[[str], None] | None = None) -> StopChannel:
        """A channel with a new key, so a restarted job never reads an old stop (a collective)."""
        token = trainer.strategy.broadcast(uuid.uuid4().hex if trainer.is_global_zero else None, src=0)
        return cls(f"project/stop/{token}", on_agreed)

    def propose(self, step: int, why: str) -> None:
        """Propose stopping after ``step`` (the first proposal of any rank wins); callable from any thread."""
        self._proposing.compare_set(self.key, "", f"{step} {why}")

    def close(self) -> None:
        """Training is over (or failed): end this rank's watcher before the store's host, rank 0, goes. Never raises."""
        if self._closing.is_set():
            return
        self._closing.set()
        with contextlib.suppress(Exception):
            self._proposing.compare_set(self.key, "", DONE)  # the others' watchers end at once too
        self._thread.join(timeout=10)

    def _wait(self) -> None:
        # It must end before the process does (a thread blocked in the store client at exit aborts the process).
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
