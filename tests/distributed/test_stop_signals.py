"""A stop signal at any moment of a 2-process fit ends it with exit code 75 and one line, never by the signal itself.

Before the first step (set-up, the restore of a checkpoint, the micro-batch trial, the sanity check) nothing of this
run is lost: every rank ends at once and ``--resume auto`` starts the run again in the same run directory. A repeated
or mixed signal while the stop ends the processes changes nothing. A signal to one rank during a long validation
ends every rank within the grace period, saying what is kept. A signal to torchrun's agent is forwarded to the
workers when torchrun is told to handle it (``--signals_to_handle``). The signal is sent from outside, as a
scheduler sends it, while every rank waits at the named moment (``preempt_faults.WaitAt``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, CPU_DDP, DIGITS, FAST, cli_env, descendants, free_port, has_layer, run_cli, run_dirs

pytestmark = pytest.mark.distributed
RUN = Path("logs/digits/version_0")
TWO = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--parallel.devices", "2"]
TWO += ["--parallel.global_batch_size", "32", "--trainer.max_steps", "6", "--trainer.limit_val_batches", "2"]
TWO += ["--test_after_fit", "false"]
GONE_WITHIN_S = 20.0
#: The micro-batch trial is the microbatch layer's (``micro_batch: auto``): without it, that moment is not there.
NEEDS_MICROBATCH = pytest.mark.skipif(
    importlib.util.find_spec("project.extras.microbatch") is None, reason="the microbatch layer was stripped"
)


def callback(class_path: str, **init: object) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": f"preempt_faults.{class_path}", "init_args": init})


def arrived(record: Path, ranks: int, running: Future, within_s: float = 180.0) -> dict[int, int]:
    """The pids of the ranks once all of them wrote ``at<rank>.json`` (they wait there now)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if running.done():
            pytest.fail(f"the run ended before every rank arrived: {running.result().stderr[-3000:]}")
        found = {int(p.stem.removeprefix("at")): json.loads(p.read_text())["pid"] for p in record.glob("at*.json")}
        if len(found) == ranks:
            return found
        time.sleep(0.1)
    pytest.fail(f"the ranks did not all arrive within {within_s} s: {sorted(record.iterdir())}")


def signal_while_waiting(tmp_path: Path, args: list[str], moment: str, to: dict[int, str], **wait) -> tuple:
    """Run a 2-process fit that waits at ``moment``; send ``to[rank]`` to each rank there; its result and pids."""
    record = tmp_path / "record"
    record.mkdir(exist_ok=True)
    for old in record.glob("at*.json"):
        old.unlink()
    with ThreadPoolExecutor(1) as pool:
        running: Future = pool.submit(
            run_cli, [*args, callback("WaitAt", moment=moment, record=str(record), **wait)], tmp_path
        )
        pids = arrived(record, 2, running)
        for rank, name in to.items():
            os.kill(pids[rank], signal.Signals[name])
        return running.result(), pids


def assert_stopped_once(result, *needles: str) -> None:
    assert result.returncode == 75, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def assert_gone(pids) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _running(pid)]
        time.sleep(0.1)
    assert alive == []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def step_of(path: Path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


@pytest.mark.parametrize(
    ("moment", "to", "extra", "resume"),
    [
        ("sanity_check", {0: "SIGUSR2", 1: "SIGUSR2"}, [], True),
        pytest.param(  # the resume: shown once
            "micro_batch", {1: "SIGTERM"}, ["--parallel.micro_batch", "auto"], False, marks=NEEDS_MICROBATCH
        ),
    ],
    ids=["sigusr2-to-every-rank-in-the-sanity-check", "sigterm-to-rank-1-in-the-micro-batch-trial"],
)
def test_a_signal_before_the_first_step_ends_every_rank_with_75_and_resume_starts_it_again(
    tmp_path, moment, to, extra, resume
):
    stopped, pids = signal_while_waiting(tmp_path, [*TWO, *extra], moment, to)
    name = next(iter(to.values()))
    assert_stopped_once(stopped, "before the first training step", "nothing was trained")
    assert f"stopped by {name} to rank" in stopped.stderr or "stopped on a signal" in stopped.stderr
    assert_gone(pids.values())
    assert run_dirs(tmp_path) == [], stopped.stderr[-3000:]  # nothing left: the run starts again as version_0
    if not resume:
        return
    resumed = run_cli([*TWO, *extra, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in run_dirs(tmp_path)] == ["version_0"]


def test_a_signal_while_a_checkpoint_is_restored_keeps_it_and_resume_continues_the_same_run(tmp_path):
    first = run_cli([*TWO, "--trainer.max_steps", "3"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    last = tmp_path / RUN / "checkpoints" / "last.ckpt"
    assert step_of(last) == 3
    before = sorted(p.name for p in (tmp_path / RUN).rglob("*"))
    stopped, pids = signal_while_waiting(tmp_path, [*TWO, "--resume", "auto"], "restore", {1: "SIGTERM"})
    assert_stopped_once(stopped, "before the first training step")
    assert_gone(pids.values())
    assert step_of(last) == 3 and sorted(p.name for p in (tmp_path / RUN).rglob("*")) == before
    resumed = run_cli([*TWO, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in run_dirs(tmp_path)] == ["version_0"] and step_of(last) == 6


@pytest.mark.parametrize(
    ("first", "second"),
    [({"to": "all", "signal_name": "SIGTERM"}, "SIGTERM"), ({"rank": 1, "signal_name": "SIGTERM"}, "SIGUSR1")],
    ids=["sigterm-twice-to-every-rank", "sigterm-to-rank-1-then-sigusr1-to-rank-0"],
)
def test_a_second_signal_while_the_stop_ends_the_processes_keeps_75_and_the_saved_step(tmp_path, first, second):
    record = tmp_path / "record"
    record.mkdir()
    init = {"step": 3, "rank": 0, "record": str(record), **first}
    again = callback("SignalAgainAtExit", signal_name=second, record=str(record), after_s=1.0)
    stopped = run_cli([*TWO, "--trainer.max_steps", "40", callback("SignalAtStep", **init), again], tmp_path)
    assert_stopped_once(stopped, "stopped by SIGTERM to rank " + ("1" if "rank" in first else ""))  # "all": either
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in record.glob("rank*.json")}
    assert step_of(tmp_path / RUN / "checkpoints" / "last.ckpt") == ranks[0]["last_step"]
    assert (record / "again.json").is_file()  # the second signal was sent, 1 s after the first, at rank 0's exit


def test_a_signal_at_the_last_step_saves_it_and_resume_runs_the_test_that_did_not(tmp_path):
    args = [*TWO[:-2], "--test_after_fit", "true"]
    stopped = run_cli([*args, callback("SignalAtStep", step=6, rank=1)], tmp_path)
    assert_stopped_once(stopped, "stopped by SIGTERM to rank 1 at step 6 (the last step; the test and export")
    assert step_of(tmp_path / RUN / "checkpoints" / "last.ckpt") == 6
    resumed = run_cli([*args, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "test/acc" in resumed.stdout and [p.name for p in run_dirs(tmp_path)] == ["version_0"]


def test_a_signal_during_the_test_after_fit_ends_it_with_75_saying_what_did_not_run(tmp_path):
    args = [*TWO[:-2], "--test_after_fit", "true"]
    stopped, pids = signal_while_waiting(tmp_path, args, "test", {0: "SIGTERM"})
    assert_stopped_once(stopped, "stopped by SIGTERM to rank 0 after the last training step (6)", "did not run")
    assert step_of(tmp_path / RUN / "checkpoints" / "last.ckpt") == 6
    assert_gone(pids.values())


def test_a_signal_to_one_rank_during_a_long_validation_ends_both_within_the_grace_saying_what_is_kept(tmp_path):
    args = [*TWO, "--parallel.stop_grace_s", "3", "--trainer.max_steps", "40"]
    stopped, pids = signal_while_waiting(tmp_path, args, "validation", {1: "SIGTERM"}, wait_s=12.0)
    assert_stopped_once(stopped, "the stop on SIGTERM to rank 1 did not complete within 3 s", "fit --resume auto")
    assert "out-of-memory" not in stopped.stderr and "disk" not in stopped.stderr
    assert_gone(pids.values())


def test_sigusr1_then_sigterm_to_torchruns_agent_stop_the_workers_at_one_saved_step(tmp_path):
    steps, log = tmp_path / "step", tmp_path / "torchrun.log"
    agent = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    agent += ["--signals_to_handle", "SIGTERM,SIGINT,SIGUSR1,SIGUSR2", "-m", "project", *TWO]
    agent += ["--trainer.max_steps", "400", callback("StepFile", path=str(steps), delay_s=0.2)]
    with log.open("w") as out:
        launcher = subprocess.Popen(agent, cwd=tmp_path, env=cli_env(), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 180
        while not (steps.is_file() and steps.read_text().strip() and int(steps.read_text()) >= 3):
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        workers = descendants(launcher.pid)
        launcher.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = log.read_text()
    assert text.count("error: stopped by SIGUSR1 to rank") == 1, text[-3000:]  # the workers' own line, once
    saved = step_of(tmp_path / RUN / "checkpoints" / "last.ckpt")
    assert saved >= 3 and f"at step {saved}: " in text, text[-3000:]
    assert launcher.returncode == 1  # torchrun's own code after a signal (docs/launching.md): not 75
    assert_gone(workers)


@pytest.mark.skipif(not has_layer("sharding"), reason="fsdp is the sharding layer's")
def test_a_rank_killed_during_the_fsdp_background_save_of_a_stop_is_named_not_the_disk(tmp_path):
    fsdp = [a.replace(CPU_DDP, str(CONFIGS / "sharding" / "cpu_fsdp.yaml")) for a in TWO]
    stop_and_kill = [callback("SignalAtStep", step=3), callback("KillInShardWrite", step=3, rank=1)]
    result = run_cli([*fsdp, "--trainer.max_steps", "40", *stop_and_kill], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line or "warning:" in line]
    assert len(errors) == 1 and "rank 1 (pid" in errors[0] and "was killed by SIGKILL" in errors[0], errors
    assert "disk" not in result.stderr and "Traceback" not in result.stderr


def test_a_signal_while_fit_starts_up_ends_it_with_75_and_one_line(tmp_path):
    starting = subprocess.Popen(
        [sys.executable, "-m", "project", *TWO], cwd=tmp_path, env=cli_env(), stderr=subprocess.PIPE, text=True
    )
    time.sleep(1.5)  # importing torch and Lightning, or building: long before the first step
    starting.send_signal(signal.SIGTERM)
    _, stderr = starting.communicate(timeout=60)
    assert starting.returncode == 75, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "before the first training step" in errors[0]
    assert run_dirs(tmp_path) == []
