"""Replica agreement: a weight changed on one rank stops a 2-process DDP run at the next save, in one line, with
that save never written; the guard runs no collective on the steps between saves.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import CPU_DDP, FAST, every_10_steps, run_cli

RUN = Path("logs/digits/version_0")
TWO = ["fit", "--config", every_10_steps(), "--config", CPU_DDP, "--config", FAST, "--test_after_fit", "false"]
TWO += ["--trainer.limit_val_batches", "2"]


def callback(class_path: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


def test_a_weight_changed_on_one_rank_stops_the_run_at_the_next_save_which_is_never_written(tmp_path):
    result = run_cli([*TWO, "--trainer.max_steps", "40", callback("guard_shapes.PerturbOneRank", step=13)], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        "error: the data-parallel replicas diverged by step 18: parameter 'net.layers.0.weight'"
    )
    assert "before the checkpoint of step 18 was written (it was not)" in errors[0]
    assert "Traceback" not in result.stderr
    last = torch.load(tmp_path / RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 10  # the save before the perturbation stays the newest
    assert f"the newest checkpoint is still {RUN / 'checkpoints' / 'last.ckpt'}" in errors[0]


def test_the_guard_runs_no_collective_on_an_ordinary_step(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    count = callback("guard_shapes.CountAllReduces", record=str(record))
    result = run_cli([*TWO, "--trainer.max_steps", "14", count], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        counts = {int(k): v for k, v in json.loads((record / f"collectives{rank}.json").read_text()).items()}
        # 9 steps an epoch on two processes: the saves of steps 9 (epoch end) and 10 (every 10 steps) and the end
        # of fit compare (step 0: DDP's set-up); no step between.
        assert {step for step, n in counts.items() if n} <= {0, 9, 10, 14}, counts
        assert counts.get(14, 0) >= 1  # the comparison at the end of fit, counted
