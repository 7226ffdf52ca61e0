"""Each rank's watcher: notices a stall, and on any rank's word writes this rank's record; rank 0 sums them up.

The ranks talk over the rendezvous store (key-value requests to ``MASTER_ADDR:MASTER_PORT``, which rank 0 or the
launcher hosts on its own thread), never a collective: a stalled rank's collectives are what is stuck. A thread
per rank looks, once a second, whether the dump was asked (one store request) and whether one of its own
collectives has waited past the stall threshold (the Flight Recorder's ring, read in memory); nothing happens on
the training thread. The first rank to see a stall, or the first to time out, asks for the dump; each rank
writes ``hang/rank<r>.txt`` (+ ``.json``) and hands its record over the store; rank 0's watcher (alive even when
rank 0's own training thread is the stuck one) compares them and writes ``hang/summary.txt``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from project.checkpoints.atomic import atomic_write_text
from project.extras.resilience.hang.records import last_collectives, rank_record
from project.extras.resilience.hang.verdict import rank_text, summary_text, verdict
from project.extras.resilience.hang.workers import WorkerStacks
from project.parallel.collectives import store_client

#: Seconds between two looks of the watcher.
POLL_S = 1.0
#: Seconds the summariser waits for every rank's record (a rank that gives none by then is named as gone).
GATHER_S = 10.0
#: Seconds the rank that timed out waits for rank 0's summary before it writes one itself.
SUMMARY_WAIT_S = 20.0
#: Seconds one store request may take.
REQUEST_S = 10.0


class HangWatch:
    """This rank's watcher for one fit (``token`` is new per run attempt, so a restarted job reads no old dump)."""

    def __init__(self, token: str, rank: int, world: int, folder: Path, stall_s: float, skip: Callable[[], set[int]]):
        self.base, self.rank, self.world = f"project/hang/{token}", rank, world
        self.folder, self.stall_s = folder, stall_s
        self.line: str | None = None  # the verdict, once this process knows it
        self.line_at = 0.0  # when the ranks' records were compared (wall clock)
        self._skip = skip
        self._workers = WorkerStacks()
        self._client = store_client(REQUEST_S)
        self._main_client: Any = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="project-hang-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the watcher (the fit is over); idempotent, never raises."""
        self._closing.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=REQUEST_S + POLL_S)

    def explain(self, why: str) -> str | None:
        """At a timeout, on the training thread: ask every rank for its record and return the summary's line."""
        with contextlib.suppress(Exception):  # the store may be gone with rank 0: then there is no report
            client = self._client_now()
            client.compare_set(f"{self.base}/dump", "", why)
            deadline = time.monotonic() + SUMMARY_WAIT_S
            while time.monotonic() < deadline:
                if client.check([f"{self.base}/summary"]):
                    self._read_summary(client)
                    return self.summary(ask=False)
                time.sleep(0.2)
            return self._summarise(client, GATHER_S / 5)  # rank 0 gave no summary: this rank writes it
        return self.summary(ask=False)

    def summary(self, ask: bool = True) -> str | None:
        """The verdict's line if the ranks' records were compared for this stall (one store request); else ``None``.

        A stall that ended (a slow save the others waited for) is not this failure's cause: a verdict older than the
        timeout (twice the stall threshold) is not returned. Only the first stall of a run is recorded. ``ask``:
        whether to ask the store (the training thread only), else only what this process knows.
        """
        with contextlib.suppress(Exception):  # the store may be gone with rank 0
            if ask and self.line is None and self._client_now().check([f"{self.base}/summary"]):
                self._read_summary(self._client_now())
        return self.line if time.time() - self.line_at <= 2 * self.stall_s + GATHER_S + SUMMARY_WAIT_S else None

    def _read_summary(self, client: Any) -> str:
        """The summariser's line (stored as ``<wall time> <line>``), kept in this process."""
        at, line = client.get(f"{self.base}/summary").decode().split(" ", 1)
        self.line, self.line_at = line, float(at)
        return line

    def _client_now(self) -> Any:
        """A store client for the calling (training) thread: the watcher's own is its thread's alone."""
        if self._main_client is None:
            self._main_client = store_client(REQUEST_S)
        return self._main_client

    def _watch(self) -> None:
        while not self._closing.wait(POLL_S):
            try:
                if self._client.check([f"{self.base}/dump"]):
                    self._dump()
                    return
                stalled = self._stalled()
                if stalled is not None:
                    self._client.compare_set(f"{self.base}/dump", "", stalled)
            except Exception:  # the store went away (rank 0 ended): there is nobody to report to
                return

    def _stalled(self) -> str | None:
        """Why this rank calls it a stall: its oldest pending collective has waited ``stall_s``; else ``None``."""
        collectives = last_collectives() or []
        waiting = [c for c in collectives if c["state"] != "done" and c["age_s"] >= self._threshold(c)]
        if not waiting:
            return None
        op = waiting[0]
        limit = f"stall threshold {self._threshold(op):g} s"
        seq = f" #{op['seq']}" if op["seq"] is not None else ""
        return f"rank {self.rank} waited {op['age_s']:g} s in {op['op']}{seq} ({limit})"

    def _threshold(self, op: dict[str, Any]) -> float:
        """The stall threshold of ``op``: half the process group's timeout, or of its own when shorter."""
        return min(self.stall_s, op.get("stall_s", self.stall_s))

    def _dump(self) -> None:
        """This rank's record: written beside the run, and handed to the summariser over the store."""
        why = self._client.get(f"{self.base}/dump").decode()
        record = rank_record(self.rank, why, self._workers.take(self._skip()))
        self._client.set(f"{self.base}/rank/{self.rank}", json.dumps(record))
        self._write(record)
        if self.rank == 0:
            self._summarise(self._client, GATHER_S)

    def _write(self, record: dict[str, Any]) -> None:
        """``hang/rank<r>.txt`` and ``.json``, unless that rank wrote them (a shared run directory)."""
        folder = self.folder / "hang"
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".txt", rank_text(record)), (".json", json.dumps(record, indent=1))):
            path = folder / f"rank{record['rank']}{suffix}"
            if not path.exists():
                atomic_write_text(path, text)

    def _summarise(self, client: Any, wait_s: float) -> str | None:
        """Gather every rank's record (``wait_s`` at most), write the summary and publish its line (one writer)."""
        if client.compare_set(f"{self.base}/summariser", "", str(self.rank)).decode() != str(self.rank):
            return None
        keys = {r: f"{self.base}/rank/{r}" for r in range(self.world)}
        deadline = time.monotonic() + wait_s
        while not client.check(list(keys.values())) and time.monotonic() < deadline:
            time.sleep(0.1)
        records = {r: json.loads(client.get(k)) if client.check([k]) else None for r, k in keys.items()}
        for record in records.values():
            if record is not None:
                self._write(record)
        why = client.get(f"{self.base}/dump").decode()
        line = verdict(records)
        (self.folder / "hang").mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder / "hang" / "summary.txt", summary_text(records, line, why))
        self.line, self.line_at = line, time.time()
        client.set(f"{self.base}/summary", f"{self.line_at} {line}")
        return line
