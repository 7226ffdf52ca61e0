"""This rank's record at a stall: every thread's Python stack, its last collectives, its step and loop phase.

Nothing here runs per step except :class:`Phase`'s two attribute writes (from the callback's hooks). The
collectives come from torch's Flight Recorder (a ring buffer in C++ that records every collective of every
process group, DDP's gradient all-reduces included, when ``TORCH_FR_BUFFER_SIZE`` > 0 at the group's creation).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from project.extras.resilience.lightning_private import AUTOGRAD_BACKWARD_FRAME, flight_recorder_json

#: The last collectives each record keeps (and the Flight Recorder's ring, unless TORCH_FR_BUFFER_SIZE is set).
LAST_COLLECTIVES = 64
_STDLIB = (sysconfig.get_paths()["stdlib"], "<frozen", "<string>")
_LIBRARY = ("site-packages", "dist-packages")


@dataclass
class Phase:
    """Where this rank's loop is: set by :class:`project.extras.resilience.hang.callback.HangRecorder`'s hooks."""

    name: str = "setup"
    step: int | None = None


#: This process's loop phase (one per process: one Trainer runs at a time).
PHASE = Phase()


#: Waits of the template's own that the Flight Recorder does not see (gloo's monitored barrier), by id.
_OWN_WAITS: dict[int, dict[str, Any]] = {}


@contextlib.contextmanager
def waiting_in(op: str, group: str, timeout_s: float) -> Iterator[None]:
    """Record a wait the Flight Recorder does not (``op`` at ``group``); a stall after half of ``timeout_s``."""
    entry = {"seq": None, "op": op, "group": group, "shapes": [], "since": time.time(), "stall_s": timeout_s / 2}
    _OWN_WAITS[id(entry)] = entry
    try:
        yield
    finally:
        _OWN_WAITS.pop(id(entry), None)


def is_library(path: str) -> bool:
    """Whether ``path`` is installed code (site-packages) or Python's own, not the run's code."""
    return path.startswith(_STDLIB) or any(f"/{part}/" in path for part in _LIBRARY)


def short_path(path: str) -> str:
    """``torch/utils/data/dataloader.py`` for installed code, the file name for the run's own."""
    for part in _LIBRARY:
        if f"/{part}/" in path:
            return path.split(f"/{part}/", 1)[1]
    return os.path.basename(path)


def _called(frames: list[list[Any]]) -> list[list[Any]]:
    """The frames from the first installed-library frame inward: what the library called (all, without one)."""
    first = next((i for i, f in enumerate(frames) if any(f"/{p}/" in f[0] for p in _LIBRARY)), 0)
    return frames[first:] or frames


def own_frames(frames: list[list[Any]]) -> list[list[Any]]:
    """The run's own code (not installed, not Python's) that a library called: a LightningModule's hook, a dataset."""
    return [f for f in _called(frames) if not is_library(f[0])]


def locate(frames: list[list[Any]]) -> str:
    """Where a stack (outermost first: ``[file, line, function, ...]``) is, as ```file.py:42 function```.

    The innermost frame of the run's own code that a library called, with the one that called it; if there is
    none (a rank in DDP's backward, or waiting for a loader's worker), the innermost installed-library frame.
    """
    called, own = _called(frames), own_frames(frames)
    installed = [f for f in called if not f[0].startswith(_STDLIB)]
    chosen = (own or installed or called or [["?", 0, "?"]])[-1]
    text = f"`{short_path(chosen[0])}:{chosen[1]} {chosen[2]}`"
    if len(own) > 1 and own[-2][2] != chosen[2]:
        text += f" (called from `{short_path(own[-2][0])}:{own[-2][1]} {own[-2][2]}`)"
    return text


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's stack (outermost frame first), the main thread first; the calling thread is left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main, me = threading.main_thread().ident, threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        frames = [[f.filename, f.lineno, f.name, f.line or ""] for f in traceback.extract_stack(frame)]
        stacks.append({"name": names.get(ident, f"thread {ident}"), "main": ident == main, "frames": frames})
    return sorted(stacks, key=lambda s: not s["main"])


def last_collectives(limit: int = LAST_COLLECTIVES) -> list[dict[str, Any]] | None:
    """This process's last ``limit`` collectives, oldest first; ``None`` when the Flight Recorder is off.

    State: ``done`` (completed, or retired by its timeout); of a group's pending ones the oldest is ``running``
    (a backend runs a group's collectives in order) and the later ones ``queued``.
    """
    text = flight_recorder_json()
    if text is None:
        return None
    entries = json.loads(text).get("entries", [])[-limit:]
    now, seen_pending = time.time_ns(), set()
    out = []
    for e in entries:
        group = e.get("pg_id", 0)
        if e.get("retired") or e.get("state") == "completed":
            state = "done"
        else:
            state = "running" if group not in seen_pending or e.get("state") == "started" else "queued"
            seen_pending.add(group)
        names = e.get("process_group") or [str(group), ""]
        out.append(
            {
                "seq": e.get("p2p_seq_id") if e.get("is_p2p") else e.get("collective_seq_id"),
                "op": str(e.get("profiling_name", "?")).split(":")[-1],
                "group": names[1] or names[0],
                "shapes": e.get("input_sizes", []),
                "state": state,
                "age_s": round((now - int(e.get("time_created_ns", now))) / 1e9, 1),
            }
        )
    for wait in list(_OWN_WAITS.values()):  # the newest: waits of the template's own, now
        age = round(time.time() - wait["since"], 1)
        out.append({**{k: v for k, v in wait.items() if k != "since"}, "state": "running", "age_s": age})
    return out


def rank_record(rank: int, why: str, workers: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's record (JSON-able): host, pid, phase, step, last collectives, every thread's stack, workers'."""
    stacks = thread_stacks()
    main = next((s for s in stacks if s["main"]), None)
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "why": why,
        "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "phase": PHASE.name,
        "step": PHASE.step,
        "where": locate(main["frames"]) if main is not None else "`?`",
        # A collective issued from autograd's backward is DDP's gradient all-reduce (a bucket's).
        "in_backward": main is not None and any(f[2] == AUTOGRAD_BACKWARD_FRAME for f in main["frames"]),
        "collectives": last_collectives(),
        "threads": stacks,
        "workers": workers,
    }
