"""MLflow on several processes: one run per training across a SIGKILLed rank and resumes on another world size.

2 processes (a rank SIGKILLed at step 15, last.ckpt at step 10) -> resumed on 1 process (SIGKILLed at step 25,
last.ckpt at step 20) -> resumed on 2 processes to step 30. The global batch stays 32, so each resume is allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mlflow_runs import (
    MLFLOW,
    all_runs,
    artifacts,
    assert_each_step_once,
    callback,
    default_store,
    histories,
)

from helpers import CPU_DDP, FAST, every_10_steps, read_scalars, run_cli

RUN = Path("logs/digits/version_0")
SHORT = [
    "--config", FAST, "--config", MLFLOW, "--parallel.global_batch_size", "32", "--trainer.max_steps", "30",
    "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "2", "--test_after_fit", "false",
]  # fmt: skip


def fit(cwd: Path, processes: int, *extra: str):
    """A tracked fit on ``processes`` CPU processes (the layout config right after digits.yaml, as users write it)."""
    layout = ["--config", CPU_DDP] if processes > 1 else []
    return run_cli(["fit", "--config", every_10_steps(), *layout, *SHORT, *extra], cwd)


@pytest.mark.distributed
def test_two_processes_killed_then_resumed_on_one_and_on_two_stay_one_mlflow_run(tmp_path):
    uri = default_store(tmp_path)
    killed = fit(tmp_path, 2, callback("faults.KillAtStep", step=15, rank=1))
    assert killed.returncode != 0
    runs = all_runs(uri)
    assert len(runs) == 1, killed.stdout[-2000:] + killed.stderr[-4000:]
    (first,) = runs
    assert max(step for step, _ in histories(uri, first)["train/loss"]) > 10  # logged past last.ckpt (step 10)

    on_one = fit(tmp_path, 1, "--resume", "auto", callback("faults.KillAtStep", step=25, rank=0))
    assert on_one.returncode == -9, on_one.stderr[-3000:]
    assert f"MLflow run {first.info.run_id} (digits/version_0) continues in" in on_one.stderr
    (middle,) = all_runs(uri)
    assert middle.info.status == "RUNNING"  # set again by the resume; a SIGKILL ends nothing
    # MLflow parameters cannot change: the first world size stays, the new one is a tag from the resumed step on.
    assert middle.data.params["plan/world_size"] == "2"
    assert middle.data.tags["changed/plan/world_size"] == "1 from step 10"

    on_two = fit(tmp_path, 2, "--resume", "auto")
    assert on_two.returncode == 0, on_two.stderr[-3000:]
    (run,) = all_runs(uri)
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "digits/version_0"
    assert run.data.tags["changed/plan/world_size"] == "2 from step 20"
    assert run.data.params["plan/global_batch_size"] == "32" and run.data.params["plan/scenario"] == "cpu"
    history = histories(uri, run)
    assert_each_step_once(history)
    tensorboard = dict(read_scalars(tmp_path / RUN)["train/loss"])
    assert [step for step, _ in history["train/loss"]] == sorted(tensorboard) == list(range(1, 30, 2))
    assert {"config.yaml", "plan.json", "export/model.pt", "export/model.json"} <= artifacts(uri, run.info.run_id)
    stored = tmp_path / "logs" / "mlflow-artifacts" / run.info.run_id / "artifacts"
    assert json.loads((stored / "plan.json").read_text())["world_size"] == 2  # the newest plan.json
    last = torch.load(tmp_path / RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["tracking"] == {"mlflow_run_id": run.info.run_id}
