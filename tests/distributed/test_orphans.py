"""Nothing outlives its launcher: killing torchrun's agent, or rank 0 (Lightning's launcher, forked ranks), ends all.

Without the parent-death signal the workers were re-parented to init and trained on to the end, writing last.ckpt,
events and export/ into the run directory that a requeued job was training in too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from project.launch.orphans import launcher_of

from helpers import CPU_DDP, DIGITS, FAST, cli_env, descendants, free_port

pytestmark = pytest.mark.distributed
TORCHRUN = ("-m", "torch.distributed.run")
LONG = ["--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--trainer.max_steps", "20"]
LONG += ["--trainer.limit_val_batches", "1", "--test_after_fit", "false"]
#: Every rank spends this long after each step on its own (no collective): a rank that outlived its launcher would
#: live on that long before its next all-reduce failed, so the test tells the parent-death signal from that.
STEP_S = 60.0
GONE_WITHIN_S = 5.0


def step_file(path: Path) -> str:
    init = {"path": str(path), "delay_s": STEP_S}
    return "--trainer.callbacks+=" + json.dumps({"class_path": "preempt_faults.StepFile", "init_args": init})


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` with the log's tail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s} s\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def step_reached(path: Path, step: int) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text()) >= step
    return False


def kill_the_launcher_mid_training(tmp_path: Path, module: tuple[str, ...], env: dict[str, str]) -> list[int]:
    """Start a 2-rank fit, SIGKILL the process the test started once it trains; the ranks it had started."""
    steps, log = tmp_path / "step", tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, *module, "fit", *LONG, step_file(steps)],
            cwd=tmp_path,
            env=cli_env(env),
            stdout=out,
            stderr=out,
        )
    ranks: list[int] = []
    try:
        wait_for(lambda: step_reached(steps, 1), 180, "the first step", log)
        ranks = [pid for pid in descendants(launcher.pid) if alive(pid)]
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + GONE_WITHIN_S
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        return ranks
    finally:
        for pid in [launcher.pid, *ranks]:  # whatever the outcome, nothing of this test outlives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=30)


def test_killing_torchruns_agent_ends_its_workers(tmp_path):
    agent = (*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "project")
    workers = kill_the_launcher_mid_training(tmp_path, agent, {})
    assert len(workers) >= 2
    assert [pid for pid in workers if alive(pid)] == []


@pytest.mark.parametrize("env", [{"PROJECT_EARLY_LAUNCH": "0"}, {}], ids=["lightnings-launcher", "forked-ranks"])
def test_killing_rank_zero_ends_the_rank_it_started(tmp_path, env):
    ranks = kill_the_launcher_mid_training(tmp_path, ("-m", "project"), env)
    assert len(ranks) >= 1
    assert [pid for pid in ranks if alive(pid)] == []


def test_which_parent_is_a_launcher():
    parent = os.getppid()
    words = [os.fsdecode(w) for w in Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")[:-1]]
    its_command = ["project/__main__.py", *words[1:]]  # Lightning's launcher re-runs rank 0's command line
    assert launcher_of({"TORCHELASTIC_RUN_ID": "job"}, ["project/__main__.py", "fit"]) == parent
    assert launcher_of({"LOCAL_RANK": "1"}, its_command) == parent
    assert launcher_of({"LOCAL_RANK": "0"}, its_command) is None  # rank 0 of its node starts the others
    # LOCAL_RANK set by hand, from a shell or a script that runs another command: left alone.
    assert launcher_of({"LOCAL_RANK": "1"}, ["project/__main__.py", "fit", "--config", "not-the-parents.yaml"]) is None
    assert launcher_of({}, its_command) is None
