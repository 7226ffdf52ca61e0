"""Never lose progress: checkpoints every N steps, atomic background writes, auto-resume, exact resume, elastic restart.

A run is killed with SIGKILL at a chosen step (a test-only callback, no sleeps), resumed with
``--resume auto`` or ``--ckpt_path last``, and compared with the same run left alone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from project.checkpoints.resume import RunName, choose_checkpoint, find_resume_checkpoint
from project.errors import UserError

from helpers import CPU_DDP, DIGITS, FAST, every_10_steps, read_scalars, run_cli, run_dirs

# 19 steps per epoch on one process, 9 on two; last.ckpt every 10 steps and at every epoch end.
STEPS = every_10_steps()
SHORT = ["--config", FAST, "--trainer.max_epochs", "3", "--trainer.limit_val_batches", "2", "--test_after_fit", "false"]
ONE = ["fit", "--config", STEPS, *SHORT, "--trainer.max_steps", "40"]
TWO = ["fit", "--config", STEPS, "--config", CPU_DDP, *SHORT, "--trainer.max_steps", "25"]
# configs/digits.yaml as it is (dropout, BatchNorm; last.ckpt by time and at every epoch end): a kill in epoch 1
# resumes from the save of epoch 0's end.
EPOCHS = ["fit", "--config", DIGITS, *SHORT, "--trainer.max_steps", "40"]
RUN = Path("logs/digits/version_0")


def callback(class_path: str, **init_args) -> str:
    """``--trainer.callbacks+=`` for a test-only callback (``tests/`` is on PYTHONPATH)."""
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


def checkpoint(cwd: Path, name: str = "last.ckpt") -> dict:
    return torch.load(cwd / RUN / "checkpoints" / name, weights_only=True)


def assert_same_weights(got: dict, want: dict, atol: float = 0.0) -> None:
    assert got["global_step"] == want["global_step"]
    for key, value in want["state_dict"].items():
        if atol == 0.0 or not value.is_floating_point():
            assert torch.equal(got["state_dict"][key], value), key
        else:
            torch.testing.assert_close(got["state_dict"][key], value, atol=atol, rtol=0.0, msg=key)


def train_loss(cwd: Path) -> dict[int, float]:
    return dict(read_scalars(cwd / RUN)["train/loss"])


@pytest.fixture(scope="module")
def uninterrupted_one(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("uninterrupted_one")
    result = run_cli(ONE, cwd)
    assert result.returncode == 0, result.stderr
    return cwd


@pytest.fixture(scope="module")
def uninterrupted_two(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("uninterrupted_two")
    result = run_cli(TWO, cwd)
    assert result.returncode == 0, result.stderr
    return cwd


@pytest.fixture(scope="module")
def killed_during_save(tmp_path_factory) -> Path:
    """A one-process run SIGKILLed half-way through writing the checkpoint of step 30."""
    cwd = tmp_path_factory.mktemp("killed_during_save")
    result = run_cli([*ONE, callback("resume_faults.KillDuringSave", step=30)], cwd)
    assert result.returncode == -9, result.stderr
    return cwd


# ------------------------------------------------------------------------ finding the checkpoint
def _save(path: Path, payload: dict, mtime: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    os.utime(path, ns=(mtime, mtime))


def test_the_newest_good_checkpoint_wins_and_bad_ones_are_named(tmp_path, capsys):
    full = {"state_dict": {"w": torch.ones(2)}, "loops": {}, "epoch": 1, "global_step": 20}
    _save(tmp_path / "version_0/checkpoints/last.ckpt", full, 1_000)
    _save(tmp_path / "version_1/checkpoints/last.ckpt", full, 2_000)
    _save(tmp_path / "version_1/checkpoints/weights.ckpt", {"state_dict": full["state_dict"]}, 3_000)
    truncated = tmp_path / "version_2/checkpoints/last.ckpt"
    _save(truncated, full, 4_000)
    truncated.write_bytes(truncated.read_bytes()[:100])
    os.utime(truncated, ns=(4_000, 4_000))
    (tmp_path / "version_2/checkpoints/.last.ckpt.abc.tmp").write_bytes(b"half a write")

    path, detail = find_resume_checkpoint(RunName(tmp_path))
    assert path == tmp_path / "version_1/checkpoints/last.ckpt" and detail == "epoch 1, step 20"
    warnings = capsys.readouterr().err
    assert f"skipping checkpoint {truncated}" in warnings and "truncated or corrupt" in warnings
    assert "weights.ckpt" in warnings and "weights only" in warnings
    assert find_resume_checkpoint(RunName(tmp_path, "version_0"))[0] == tmp_path / "version_0/checkpoints/last.ckpt"
    assert find_resume_checkpoint(RunName(tmp_path / "nothing")) is None


def test_resume_and_an_explicit_checkpoint_are_one_choice():
    from jsonargparse import Namespace

    with pytest.raises(UserError, match=r"--resume auto and --ckpt_path x.ckpt both choose the checkpoint"):
        choose_checkpoint("fit", "x.ckpt", "auto", Namespace(logger=None))
    with pytest.raises(UserError, match=r"trainer.logger is false"):
        choose_checkpoint("test", "last", None, Namespace(logger=False))


# ------------------------------------------------------------------------------ exact resume
@pytest.mark.fast
def test_sigkill_mid_epoch_then_resume_auto_is_bit_exact_on_one_process(tmp_path, uninterrupted_one):
    killed = run_cli([*ONE, callback("faults.KillAtStep", step=15, rank=0)], tmp_path)
    assert killed.returncode == -9, killed.stderr
    resumed = run_cli([*ONE, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 0, step 10)" in resumed.stderr
    # The same run folder, its curve continued: the steps logged before the kill and after the resume
    # are the uninterrupted run's, with the same values.
    assert run_dirs(tmp_path) == [tmp_path / RUN]
    assert train_loss(tmp_path) == train_loss(uninterrupted_one)
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_one))


def test_a_resume_from_the_epoch_end_save_is_bit_exact_with_dropout_and_batch_norm(tmp_path_factory):
    """The epoch-end checkpoint (dropout 0.1, BatchNorm): the resumed run trains every step of the next epochs.

    Saved where ModelCheckpoint saves it (``on_train_epoch_end``), Lightning 2.6 resumes it one epoch short and
    without the schedulers' epoch step; TimedCheckpoint saves it after the next epoch's first step (20) instead.
    """
    straight, cwd = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("killed")
    assert run_cli(EPOCHS, straight).returncode == 0
    killed = run_cli([*EPOCHS, callback("faults.KillAtStep", step=25, rank=0)], cwd)
    assert killed.returncode == -9, killed.stderr
    resumed = run_cli([*EPOCHS, "--resume", "auto"], cwd)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 1, step 20)" in resumed.stderr
    assert train_loss(cwd) == train_loss(straight)
    assert_same_weights(checkpoint(cwd), checkpoint(straight))


@pytest.mark.distributed
def test_sigkill_of_a_rank_then_resume_on_two_processes_matches(tmp_path, uninterrupted_two):
    killed = run_cli([*TWO, callback("faults.KillAtStep", step=15, rank=1)], tmp_path)
    assert killed.returncode != 0
    resumed = run_cli([*TWO, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 1, step 10)" in resumed.stderr
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_two), atol=1e-6)


@pytest.mark.distributed
def test_torchrun_restarts_a_dead_worker_and_the_job_resumes_itself(tmp_path, uninterrupted_two):
    marker = tmp_path / "killed-once"
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--max-restarts", "1", "--nproc_per_node", "2"]
    die_once = callback("resume_faults.KillOnceAtStep", step=15, marker=str(marker))
    # A fresh rendezvous store per restart: on the agent's shared one, restarted workers can read the
    # dead workers' addresses (pytorch#135712; `plan` says so).
    fresh_store = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    result = run_cli([*TWO, "--resume", "auto", die_once], tmp_path, fresh_store, module=[*torchrun, "-m", "project"])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert marker.exists()
    assert "--resume auto: no checkpoint of this run name under logs/digits yet, starting a new run" in output
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 1, step 10)" in output
    assert run_dirs(tmp_path) == [tmp_path / RUN]
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_two), atol=1e-6)


# ------------------------------------------------------------------------- kills and corruption
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_and_ckpt_path_last_resumes(
    tmp_path, killed_during_save, uninterrupted_one
):
    shutil.copytree(killed_during_save / "logs", tmp_path / "logs")
    folder = tmp_path / RUN / "checkpoints"
    (partial,) = folder.glob(".last.ckpt.*.tmp")  # the interrupted write, never renamed onto last.ckpt
    assert 0 < partial.stat().st_size < (folder / "last.ckpt").stat().st_size
    assert checkpoint(tmp_path)["global_step"] == 20  # the previous good one, intact

    resumed = run_cli([*ONE, "--ckpt_path", "last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 1, step 20)" in resumed.stderr
    assert not partial.exists()
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_one))


def test_a_corrupt_checkpoint_is_named_and_auto_resume_skips_it(tmp_path, killed_during_save):
    shutil.copytree(killed_during_save / "logs", tmp_path / "logs")
    last = tmp_path / RUN / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:5000])  # what a non-atomic writer leaves when killed
    before = sorted(p.name for p in (tmp_path / RUN).rglob("*"))

    explicit = run_cli([*ONE, "--ckpt_path", str(last)], tmp_path)
    assert explicit.returncode == 2
    assert "Traceback" not in explicit.stderr
    assert f"'{last}' is truncated or corrupt" in explicit.stderr
    assert run_dirs(tmp_path) == [tmp_path / RUN] and sorted(p.name for p in (tmp_path / RUN).rglob("*")) == before

    resumed = run_cli([*ONE, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"warning: skipping checkpoint {RUN}/checkpoints/last.ckpt" in resumed.stderr
    assert f"Resuming from {RUN}/checkpoints/best-00-00019.ckpt (epoch 0, step 19)" in resumed.stderr
    assert checkpoint(tmp_path)["global_step"] > 19


# ------------------------------------------------------------------- another number of processes
# The same global batch (32) at any world size; no dropout or batch norm, so 1 and 2 processes compute the same.
SAME_GLOBAL = [
    "--config", FAST, "--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm",
    "false", "--parallel.global_batch_size", "32", "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "2",
    "--test_after_fit", "false",
]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted_same_global(tmp_path_factory) -> Path:
    """The reference: one process, the same global batches (world-size invariant, so any layout's weights)."""
    cwd = tmp_path_factory.mktemp("uninterrupted_same_global")
    result = run_cli(["fit", "--config", STEPS, *SAME_GLOBAL], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("killed_on", "resumed_on"),
    [(2, 1), pytest.param(4, 2, marks=pytest.mark.slow)],
    ids=["2-then-1", "4-then-2"],
)
def test_a_run_killed_mid_epoch_resumes_on_another_number_of_processes(
    tmp_path, uninterrupted_same_global, killed_on, resumed_on
):
    def layout(processes: int) -> list[str]:
        return ["--config", CPU_DDP, "--parallel.devices", str(processes)] if processes > 1 else []

    def fit(processes: int, *extra: str):
        # The layout config goes right after digits.yaml: its `parallel:` section replaces the whole section.
        return run_cli(["fit", "--config", STEPS, *layout(processes), *SAME_GLOBAL, *extra], tmp_path)

    killed = fit(killed_on, callback("faults.KillAtStep", step=15, rank=killed_on - 1))
    assert killed.returncode != 0
    resumed = fit(resumed_on, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 0, step 10)" in resumed.stderr
    assert f"checkpoint of {killed_on} process(es) on {resumed_on}: the data order continues exactly" in resumed.stderr
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_same_global), atol=1e-5)


def test_a_resume_that_changes_the_global_batch_is_refused_in_one_line(tmp_path, uninterrupted_one):
    shutil.copytree(uninterrupted_one / "logs", tmp_path / "logs")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / RUN).rglob("*") if p.is_file())
    result = run_cli([*ONE, "--resume", "auto", "--parallel.global_batch_size", "32"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "global batches of 64 samples" in line and "would be 32" in line and "global_batch_size 64" in line
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / RUN).rglob("*") if p.is_file()) == before


# ------------------------------------------------------------------------ preemption: a signal, not a kill
def test_sigterm_saves_the_step_it_stops_at_and_resume_auto_is_bit_exact_on_one_process(tmp_path, uninterrupted_one):
    stopped = run_cli([*ONE, callback("preempt_faults.SignalAtStep", step=15, rank=0)], tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    assert f"error: stopped by SIGTERM to rank 0 at step 15: {RUN}/checkpoints/last.ckpt holds that step" in (
        stopped.stderr
    )
    assert checkpoint(tmp_path)["global_step"] == 15  # the step it stopped at, not the save of step 10
    resumed = run_cli([*ONE, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    logged = [step for step, _ in read_scalars(tmp_path / RUN)["train/loss"]]
    assert len(logged) == len(set(logged))  # the curve continues: no step logged twice
    assert train_loss(tmp_path) == train_loss(uninterrupted_one)
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_one))


@pytest.mark.distributed
def test_sigusr1_to_one_rank_stops_both_at_one_saved_step_and_resume_matches(tmp_path, uninterrupted_two):
    record = tmp_path / "record"
    record.mkdir()
    signal_rank_1 = callback("preempt_faults.SignalAtStep", step=12, rank=1, signal_name="SIGUSR1", record=str(record))
    stopped = run_cli([*TWO, signal_rank_1], tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    last = {json.loads(path.read_text())["last_step"] for path in record.glob("rank*.json")}
    assert len(last) == 1 and 12 <= next(iter(last)) <= 14  # one step for both, at most 2 after the signal
    assert checkpoint(tmp_path)["global_step"] == next(iter(last))
    assert stopped.stderr.count("error: stopped by SIGUSR1 to rank 1") == 1  # rank 0 says it once
    resumed = run_cli([*TWO, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(checkpoint(tmp_path), checkpoint(uninterrupted_two), atol=1e-6)
