"""A signal to any rank, or to all, stops every rank at one step, saves it, and ends every process with exit code 75
(preempted, resumable), with no collective on the steps in between. Resume after it: tests/distributed/test_resume.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, run_cli

pytestmark = pytest.mark.distributed
RUN = Path("logs/digits/version_0")
GRACE_S = 20.0


def fit(tmp_path: Path, processes: int, *callbacks: str) -> tuple[object, dict[int, dict]]:
    record = tmp_path / "record"
    record.mkdir()
    args = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--parallel.devices", str(processes)]
    args += ["--parallel.global_batch_size", "32", "--trainer.limit_val_batches", "2", "--test_after_fit", "false"]
    args += [c.replace("RECORD", str(record)) for c in callbacks]
    result = run_cli(args, tmp_path)
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in record.glob("rank*.json")}
    return result, ranks


def signal_at(step: int, rank: int, signal_name: str = "SIGTERM", to: str = "self") -> str:
    init = {"step": step, "rank": rank, "signal_name": signal_name, "to": to, "record": "RECORD"}
    return "--trainer.callbacks+=" + json.dumps({"class_path": "preempt_faults.SignalAtStep", "init_args": init})


def assert_all_gone(ranks: dict[int, dict]) -> None:
    deadline = time.monotonic() + GRACE_S
    alive = [r["pid"] for r in ranks.values()]
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}") and "zombie" not in _state(pid)]
        time.sleep(0.1)
    assert alive == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


@pytest.mark.parametrize(
    ("processes", "sender", "signal_name", "to"),
    [(2, 0, "SIGTERM", "self"), (2, 0, "SIGTERM", "all"), (4, -1, "SIGTERM", "self")],
    ids=["rank0-of-2", "every-rank-of-2", "last-rank-of-4"],
)
def test_a_signal_stops_every_rank_at_one_saved_step(tmp_path, processes, sender, signal_name, to):
    result, ranks = fit(tmp_path, processes, signal_at(10, sender, signal_name, to))
    assert result.returncode == 75, result.stderr[-3000:]
    assert len(ranks) == processes
    stops = {r["last_step"] for r in ranks.values()}
    assert len(stops) == 1 and 10 <= stops.pop() <= 12  # one step for all, at most 2 after the signal
    saved = torch.load(tmp_path / RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == ranks[0]["last_step"]
    assert result.stderr.count("error: stopped by SIGTERM to rank") == 1, result.stderr[-3000:]
    assert_all_gone(ranks)


def test_no_collective_runs_on_an_ordinary_step(tmp_path):
    count = "--trainer.callbacks+=" + json.dumps(
        {"class_path": "preempt_faults.CountCollectives", "init_args": {"record": "RECORD"}}
    )
    result, _ = fit(tmp_path, 2, count, signal_at(14, 1))
    assert result.returncode == 75, result.stderr[-3000:]
    for rank in (0, 1):
        counts = {
            int(k): v for k, v in json.loads((tmp_path / "record" / f"collectives{rank}.json").read_text()).items()
        }
        stop = max(counts)
        # Step 1 checks the checkpoint clock (one broadcast), the stop step meets once (a barrier): in between, none
        # but on a logged step (every 10: digits.yaml), whose train/loss Lightning reduces to the global batch's mean.
        ordinary = {step: n for step, n in counts.items() if 1 < step < stop and step % 10}
        logged = {step: n for step, n in counts.items() if 1 < step < stop and not step % 10}
        assert ordinary == {} and all(n <= 2 for n in logged.values()), counts
        assert counts[stop] >= 1  # the counter does see the stop's barrier
