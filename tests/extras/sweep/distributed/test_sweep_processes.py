"""`python -m project sweep` with 2-process trials: `kill -9` of the driver, then the same command continues the study.

One study of 4 trials on 2 processes (``configs/parallel/cpu_ddp.yaml``) is shared by the asserts: the driver is
killed once trial 2 has saved its first epoch, every process of the sweep must be gone, and the same command then
resumes trial 2 in its own run folder with its own parameters and runs trial 3, which the median pruner stops on
both ranks at its first validation. Its trial 0 is the 2-process half
of the invariance check: a 1-process fit with the same parameters must reach the same objective within 1e-5.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from sweep_support import load_trials, processes_in, run_sweep, sweep_command, wait_until_gone, write_space

from project.extras.sweep.setup import override_args

from helpers import CPU_DDP, DIGITS, FAST, cli_env, descendants, read_scalars, run_cli, run_dirs

pytestmark = pytest.mark.distributed
SPACE = {
    "n_trials": 4,
    "seed": 0,
    "parameters": {
        "optimizer.init_args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True},
        "model.init_args.net.init_args.hidden": {"type": "categorical", "choices": [16, 32]},
    },
    # The same global batch of 64 at any world size, and nothing random or batch-statistical per rank (dropout,
    # batch norm): the conditions under which 1 and 2 processes train the same weights (test_distributed.py).
    "fixed": {
        "parallel.global_batch_size": 64,
        "model.init_args.net.init_args.dropout": 0.0,
        "model.init_args.net.init_args.batch_norm": False,
        # Trial 3 learns nothing: once 3 trials have completed, the median pruner stops it on both ranks at once.
        "trainer.callbacks+": {"class_path": "sweep_support.TrialFaults", "init_args": {"stall": [3]}},
    },
    "pruner": {"type": "median", "n_startup_trials": 3},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the 2-process study, kill -9 its driver during trial 2, run the same command again."""
    cwd = tmp_path_factory.mktemp("sweep_ddp")
    command = sweep_command([DIGITS, FAST, CPU_DDP], write_space(cwd / "ddp.yaml", **SPACE))
    saved = cwd / "logs" / "sweeps" / "ddp" / "trial_2" / "version_0" / "checkpoints" / "last.ckpt"
    with (cwd / "first.log").open("w") as log:
        driver = subprocess.Popen(command, cwd=cwd, env=cli_env(), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not saved.exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert driver.poll() is None and saved.exists(), (cwd / "first.log").read_text()
    before = load_trials(cwd, "ddp")
    processes = descendants(driver.pid)
    driver.kill()
    driver.wait()
    left_by_kill = wait_until_gone(cwd, timeout_s=5)
    rerun = run_sweep(command, cwd)
    return {"cwd": cwd, "before": before, "processes": processes, "left_by_kill": left_by_kill, "rerun": rerun}


def test_kill_9_of_the_driver_leaves_no_process(study):
    assert len(study["processes"]) >= 2, "trial 2 ran on 2 processes"
    assert study["left_by_kill"] == []


def test_the_same_command_continues_the_study_without_losing_or_repeating_a_trial(study):
    rerun, before = study["rerun"], study["before"]
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert [t.state.name for t in before] == ["COMPLETE", "COMPLETE", "RUNNING"]
    assert "2 of 4 trials finished so far" in rerun.stdout and "Trial 2 resumed" in rerun.stdout
    after = load_trials(study["cwd"], "ddp")
    assert [t.number for t in after] == [0, 1, 2, 3]
    assert [t.state.name for t in after] == ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"]
    assert after[2].params == before[2].params
    assert len({tuple(sorted(t.params.items())) for t in after}) == 4
    trial_2 = study["cwd"] / "logs" / "sweeps" / "ddp" / "trial_2"
    assert [p.name for p in trial_2.glob("version_*")] == ["version_0"]  # resumed in its own run folder
    assert "Resuming from" in (trial_2 / "stderr.log").read_text()
    assert sorted(after[2].intermediate_values) == [19, 38]
    assert processes_in(study["cwd"]) == []


def test_pruning_stops_both_ranks_at_the_same_validation(study):
    """A rank that went on training would leave its peer waiting in a collective: the trial would hang or fail."""
    pruned = load_trials(study["cwd"], "ddp")[3]
    assert pruned.state.name == "PRUNED" and sorted(pruned.intermediate_values) == [19]
    assert "Trial 3 pruned" in study["rerun"].stdout and "at step 19" in study["rerun"].stdout


def test_the_importances_plot_with_enough_completed_trials(study):
    folder = study["cwd"] / "logs" / "sweeps" / "ddp"
    assert (folder / "param_importances.png").stat().st_size > 1000
    assert (folder / "optimization_history.png").stat().st_size > 1000


def test_the_same_parameters_on_1_and_2_processes_give_the_same_objective(study, tmp_path):
    """Trial 0's parameters in a plain 1-process fit (forked: no second sweep to start) give trial 0's objective."""
    two = load_trials(study["cwd"], "ddp")[0]
    overrides = override_args({**SPACE["fixed"], **two.params})
    one = run_cli(["fit", "--config", DIGITS, "--config", FAST, *overrides, "--test_after_fit=false"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    # TensorBoard holds an epoch's val/acc at the epoch's last step, the study at the optimizer steps done (+1).
    values = [value for _, value in sorted(read_scalars(run)["val/acc"])]
    reported = [two.intermediate_values[step] for step in sorted(two.intermediate_values)]
    assert values == pytest.approx(reported, abs=1e-5) and len(values) == 2
    assert max(values) == pytest.approx(two.value, abs=1e-5)  # the objective: the best val/acc
