"""The ranks' records compared: who is elsewhere, and where, in one line; the summary file around it. Pure.

Three findings, in this order: ranks outside any collective while others wait in one (a rank in user code,
data loading, a save); ranks whose oldest pending collectives differ (other ops or sequence numbers: a barrier
only one rank calls); ranks that left no record (gone). When every rank waits in the same collective, the
collective itself does not complete (the backend or the network).
"""

from __future__ import annotations

from typing import Any


def pending(record: dict[str, Any]) -> dict[str, Any] | None:
    """The oldest collective this rank has not completed (the one it waits in), or ``None``."""
    waiting = [c for c in record.get("collectives") or [] if c["state"] != "done"]
    return waiting[0] if waiting else None


def collective_name(op: dict[str, Any], record: dict[str, Any] | None = None) -> str:
    """``all_reduce #812 (DDP gradients, default_pg, shapes [[2570]], for 17 s)``."""
    backward = record is not None and record.get("in_backward")
    gradients = "DDP gradients, " if backward and op["op"] == "all_reduce" else ""
    seq = f" #{op['seq']}" if op["seq"] is not None else ""
    return f"{op['op']}{seq} ({gradients}{op['group']}, shapes {op['shapes']}, for {op['age_s']:g} s)"


def phase_of(record: dict[str, Any]) -> str:
    """``training step 30``, ``validation after step 27``: the loop phase the rank's callback last saw."""
    phase, step = record.get("phase", "?"), record.get("step")
    if step is None:
        return phase
    return f"{phase} {step}" if phase == "training step" else f"{phase} after step {step}"


def ranks_text(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0, 2, 3``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def elsewhere(rank: int, record: dict[str, Any]) -> str:
    """``rank 1 is stuck in `x.py:42 training_step` (training step 30; not in a collective)``; its worker too."""
    text = f"rank {rank} is stuck in {record['where']} ({phase_of(record)}; not in a collective)"
    workers = [w for w in record.get("workers") or [] if w.get("where")]
    if workers:
        text += "; its DataLoader worker " + ", ".join(f"pid {w['pid']} is in {w['where']}" for w in workers)
    return text


def _waiting(records: dict[int, dict[str, Any]], ranks: list[int]) -> str:
    """``ranks 0, 2 wait in all_reduce #8812 (...) in training step 30``, grouped by the collective they wait in."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank in ranks:
        op = pending(records[rank])
        groups.setdefault((op["op"], op["seq"], op["group"]), []).append(rank)
    parts = []
    for members in groups.values():
        first = records[members[0]]
        verb = "waits" if len(members) == 1 else "wait"
        parts.append(f"{ranks_text(members)} {verb} in {collective_name(pending(first), first)} in {phase_of(first)}")
    return "; ".join(parts)


def verdict(records: dict[int, dict[str, Any] | None]) -> str:
    """The one line that names the rank(s) that are elsewhere, and where (``records[r] is None``: rank r is gone)."""
    gone = sorted(r for r, rec in records.items() if rec is None)
    present = {r: rec for r, rec in records.items() if rec is not None}
    if any(rec.get("collectives") is None for rec in present.values()):
        outside = [r for r, rec in present.items() if rec.get("collectives") is None]
        where = "; ".join(f"rank {r} is in {present[r]['where']} ({phase_of(present[r])})" for r in sorted(present))
        return f"{where} (no collective record on {ranks_text(outside)}: the Flight Recorder was off)"
    outside = sorted(r for r, rec in present.items() if pending(rec) is None)
    waiting = sorted(r for r in present if r not in outside)
    parts = [f"{ranks_text(gone)} left no record (gone: died, or its process cannot answer)"] if gone else []
    if outside and waiting:
        parts += [elsewhere(r, present[r]) for r in outside]
        return "; ".join([*parts, _waiting(present, waiting)])
    keys = {(pending(present[r])["op"], pending(present[r])["seq"]) for r in waiting}
    if len(keys) > 1:
        calls = "; ".join(
            f"rank {r} waits in {collective_name(pending(rec), rec)} at {rec['where']}"
            for r, rec in sorted(present.items())
        )
        return "; ".join([*parts, f"collective mismatch: {calls}: the ranks called different collectives"])
    if waiting:
        parts.append(_waiting(present, waiting) + ": every rank is in it, so it does not complete (backend, network)")
    elif outside:
        parts.append("no rank waits in a collective: " + "; ".join(elsewhere(r, present[r]) for r in outside))
    return "; ".join(parts) or "no rank left a record"


def rank_text(record: dict[str, Any]) -> str:
    """One rank's record as a text file: who, where, its last collectives, every thread's stack, its workers'."""
    lines = [
        f"rank {record['rank']} (host {record['host']}, pid {record['pid']}), written {record['written']}",
        f"why: {record['why']}",
        f"phase: {phase_of(record)}; main thread in {record['where']}",
        "",
        "last collectives (oldest first): seq op group shapes state age",
    ]
    collectives = record.get("collectives")
    if collectives is None:
        lines.append("  (none recorded: the Flight Recorder was off; TORCH_FR_BUFFER_SIZE=0)")
    for c in collectives or []:
        lines.append(f"  #{c['seq']} {c['op']} {c['group']} {c['shapes']} {c['state']} {c['age_s']:g} s")
    for thread in record.get("threads", []):
        lines += ["", f"thread {thread['name']}{' (main)' if thread['main'] else ''}, most recent call last:"]
        lines += [f'  File "{f[0]}", line {f[1]}, in {f[2]}\n    {f[3]}' for f in thread["frames"]]
    for worker in record.get("workers") or []:
        lines += ["", f"DataLoader worker pid {worker['pid']} (faulthandler, most recent call first):", worker["text"]]
    return "\n".join(lines) + "\n"


def summary_text(records: dict[int, dict[str, Any] | None], line: str, why: str) -> str:
    """``summary.txt``: the verdict, why the records were taken, and each rank's phase and pending collective."""
    lines = [line, "", f"taken because: {why}", ""]
    for rank in sorted(records):
        rec = records[rank]
        if rec is None:
            lines.append(f"rank {rank}: no record (gone)")
            continue
        op = pending(rec)
        state = f"waits in {collective_name(op, rec)}" if op is not None else "not in a collective"
        lines.append(f"rank {rank} ({rec['host']}, pid {rec['pid']}): {phase_of(rec)}; {state}; at {rec['where']}")
    lines += ["", "Each rank's stacks (every thread) and last collectives: rank<N>.txt beside this file."]
    return "\n".join(lines) + "\n"
