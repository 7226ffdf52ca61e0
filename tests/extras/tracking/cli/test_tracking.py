"""MLflow beside TensorBoard on one process: one run per training across a SIGKILL and a preemption, bad input refused.

The runs log every other step, so the killed run logged steps after its last checkpoint (step 10) that the resumed
run logs again: the store must hold each step once.
"""

from __future__ import annotations

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

from helpers import FAST, assert_clean_error, every_10_steps, free_port, read_scalars, run_cli, two_at_a_time

RUN = Path("logs/digits/version_0")
FIT = [
    "fit", "--config", every_10_steps(), "--config", FAST, "--config", MLFLOW, "--trainer.max_steps", "25",
    "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "2", "--test_after_fit", "false",
]  # fmt: skip


TAGS = ["--tracking.tags", '{"study": "s1", "trial": "3"}']


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, int, str]:
    """A tracked fit SIGKILLed at step 15 (last.ckpt: step 10), resumed and preempted at step 20 (SIGTERM, exit 75),
    resumed again to step 25; with the highest train/loss step the killed run logged and the status after the stop."""
    cwd = tmp_path_factory.mktemp("tracked")
    uri = default_store(cwd)
    killed = run_cli([*FIT, *TAGS, callback("faults.KillAtStep", step=15, rank=0)], cwd)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = all_runs(uri)
    logged = max(step for step, _ in histories(uri, run)["train/loss"])
    stopped = run_cli([*FIT, *TAGS, "--resume", "auto", callback("preempt_faults.SignalAtStep", step=20)], cwd)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert f"MLflow run {run.info.run_id} (digits/version_0) continues in" in stopped.stderr
    (preempted,) = all_runs(uri)
    resumed = run_cli([*FIT, *TAGS, "--resume", "auto"], cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return cwd, logged, preempted.info.status


def test_a_killed_preempted_and_resumed_fit_is_one_mlflow_run_with_each_step_once(resumed):
    cwd, logged_before_kill, status_when_preempted = resumed
    uri = default_store(cwd)
    (run,) = all_runs(uri)  # one run in the store: each resume continued it
    assert status_when_preempted == "KILLED"  # stopped on purpose, resumable: not FAILED
    assert run.info.status == "FINISHED" and run.info.run_name == "digits/version_0"
    assert run.data.tags["run_directory"] == str((cwd / RUN).resolve())
    assert run.data.tags["study"] == "s1" and run.data.tags["trial"] == "3"
    last = torch.load(cwd / RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["tracking"] == {"mlflow_run_id": run.info.run_id}
    history = histories(uri, run)
    assert logged_before_kill > 10  # the killed run logged steps after its checkpoint: the resume logs them again
    assert_each_step_once(history)
    # TensorBoard's steps and values (the resume is exact: the steps it holds twice agree). Both lack step 19: the
    # stop at step 20 comes before Lightning logs that batch's metrics.
    tensorboard = dict(read_scalars(cwd / RUN)["train/loss"])
    assert [step for step, _ in history["train/loss"]] == sorted(tensorboard)
    assert dict(history["train/loss"]) == pytest.approx(tensorboard, rel=1e-6)
    assert len(tensorboard) >= 11
    params = run.data.params
    assert params["plan/world_size"] == "1" and params["plan/scenario"] == "cpu" and params["plan/accumulation"] == "1"
    assert params["plan/global_batch_size"] == "64" and params["net/init_args/hidden"] == "256"
    assert not [tag for tag in run.data.tags if tag.startswith("changed/")]  # the same layout: nothing changed
    assert {"config.yaml", "plan.json", "export/model.pt", "export/model.json"} <= artifacts(uri, run.info.run_id)
    assert (cwd / "logs" / "mlflow-artifacts" / run.info.run_id / "artifacts" / "config.yaml").is_file()


def test_bad_tracking_input_is_one_line_before_anything_is_written(tmp_path):
    folders = [tmp_path / name for name in ("choice", "scheme", "server", "no-logger")]
    for folder in folders:
        folder.mkdir()
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        (["--tracking.logger", "wandb"], "tracking.logger='wandb' is not one of none, mlflow"),
        (["--tracking.tracking_uri", "foo://nowhere"], "MLflow cannot use the store foo://nowhere (not a URI scheme"),
        (["--tracking.tracking_uri", down], f"MLflow cannot use the store {down} ([Errno 111] Connection refused)"),
        (["--trainer.logger", "false"], "trainer.logger is false"),
    ]
    results = two_at_a_time(*(lambda f=f, c=c: run_cli([*FIT, *c[0]], f) for f, c in zip(folders, cases, strict=True)))
    for folder, (_, needle), result in zip(folders, cases, results, strict=True):
        assert result.returncode == 2, result.stderr[-3000:]
        assert_clean_error(result)
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert needle in line
        assert list(folder.iterdir()) == []  # no run directory, no store
