"""The hang report's pure parts: where a stack is, and the verdict over the ranks' records (no process group).

The real stalls (four faults on 2 processes, the drill) are tests/distributed/test_hang.py; these pin the rules.
"""

from __future__ import annotations

import sysconfig

import pytest

from project.extras.resilience.hang.records import locate
from project.extras.resilience.hang.verdict import summary_text, verdict
from project.extras.resilience.hang.workers import _where

pytestmark = pytest.mark.unit

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = sysconfig.get_paths()["stdlib"]
RUN = [["/repo/project/cli.py", 170, "run_command"], [f"{SITE}/lightning/pytorch/trainer/trainer.py", 580, "fit"]]


def record(rank: int, where: str, collectives: list[dict] | None, phase: str = "training step") -> dict:
    """A rank's record as :func:`project.extras.resilience.hang.records.rank_record` writes it (what verdicts read)."""
    return {
        "rank": rank,
        "host": "node",
        "pid": 100 + rank,
        "phase": phase,
        "step": 30,
        "where": where,
        "collectives": collectives,
        "workers": [],
        "in_backward": phase == "training step",
    }


def op(name: str, seq: int, state: str = "running") -> dict:
    return {"seq": seq, "op": name, "group": "default_pg", "shapes": [[10]], "state": state, "age_s": 16.0}


def test_a_stack_is_located_at_the_innermost_user_frame_a_library_called_with_its_caller():
    frames = [
        *RUN,
        ["/home/me/my_module.py", 42, "training_step"],
        ["/home/me/my_module.py", 7, "helper"],
        [f"{STDLIB}/threading.py", 320, "wait"],
    ]
    assert locate(frames) == "`my_module.py:7 helper` (called from `my_module.py:42 training_step`)"


def test_without_user_frames_below_the_library_the_innermost_installed_frame_is_named():
    frames = [
        *RUN,
        [f"{SITE}/torch/utils/data/dataloader.py", 1291, "_try_get_data"],
        [f"{STDLIB}/queue.py", 180, "get"],
    ]
    assert locate(frames) == "`torch/utils/data/dataloader.py:1291 _try_get_data`"


def test_a_rank_outside_any_collective_is_named_with_where_it_is():
    line = verdict(
        {
            0: record(0, "`graph.py:1 backward`", [op("all_reduce", 7, "done"), op("all_reduce", 8)]),
            1: record(1, "`my_module.py:42 training_step`", [op("all_reduce", 7, "done")]),
        }
    )
    assert line.startswith("rank 1 is stuck in `my_module.py:42 training_step` (training step 30; not in a collective)")
    assert "rank 0 waits in all_reduce #8 (DDP gradients, default_pg" in line


def test_ranks_in_different_collectives_are_a_mismatch():
    line = verdict(
        {
            0: record(0, "`graph.py:1 backward`", [op("all_reduce", 9)]),
            1: record(1, "`my_module.py:50 training_step`", [op("barrier", 9)]),
        }
    )
    assert line.startswith("collective mismatch: rank 0 waits in all_reduce #9")
    assert "rank 1 waits in barrier #9 (default_pg, shapes [[10]], for 16 s) at `my_module.py:50 training_step`" in line


def test_a_rank_without_a_record_is_gone_and_one_collective_everyone_waits_in_is_said_so():
    waiting = record(0, "`graph.py:1 backward`", [op("all_reduce", 3)])
    assert verdict({0: waiting, 1: None}).startswith("rank 1 left no record (gone")
    both = verdict({0: waiting, 1: record(1, "`graph.py:1 backward`", [op("all_reduce", 3)])})
    assert both.startswith("ranks 0, 1 wait in all_reduce #3") and "every rank is in it" in both
    assert "rank 1: no record (gone)" in summary_text({0: waiting, 1: None}, "line", "why")


def test_a_workers_faulthandler_dump_is_located_in_its_signalled_thread():
    dump = (
        "Thread 0x01 (most recent call first):\n"
        f'  File "{STDLIB}/socket.py", line 294 in accept\n\n'
        "Current thread 0x02 (most recent call first):\n"
        '  File "/home/me/data.py", line 12 in __getitem__\n'
        f'  File "{SITE}/torch/utils/data/_utils/fetch.py", line 52 in fetch\n'
        f'  File "{SITE}/torch/utils/data/_utils/worker.py", line 349 in _worker_loop\n'
        f'  File "{STDLIB}/multiprocessing/process.py", line 108 in run\n'
    )
    assert _where(dump) == "`data.py:12 __getitem__`"
    assert _where(dump.replace("/home/me/data.py", f"{SITE}/x/data.py")) is None  # an idle worker: not named


def test_torchs_flight_recorder_dump_still_exists():
    from torch._C import _distributed_c10d

    assert hasattr(_distributed_c10d, "_dump_fr_trace_json")
