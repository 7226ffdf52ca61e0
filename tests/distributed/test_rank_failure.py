"""A dead or stuck rank never hangs the job: every process ends, non-zero, with a message naming the rank.

Real 2-process runs over gloo, started by Lightning's own launcher and by torchrun. The fault comes from a
test-only callback (tests/faults.py) at a fixed step: step 13 is batch 4 of epoch 1 (1,257 training digits
in global batches of 2 x 64 make 9 steps per epoch), the middle of an epoch after one epoch's checkpoint.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from helpers import CPU_DDP, DIGITS, FAST, free_port, run_cli

pytestmark = pytest.mark.distributed

FIT = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST]
MID_EPOCH_STEP = "13"
# The bounds: the others end within 60 s of a kill, within timeout + 30 s of a stuck collective.
AFTER_KILL_S = 60
AFTER_TIMEOUT_S = 30
TIMEOUT_S = 20  # also the join timeout: a loaded machine can take over 10 s to start rank 1
LAUNCHERS = {
    "lightning": ("-m", "project"),  # the early layer forks the ranks at once (without it: Lightning's launcher)
    "lightning-launcher": ("-m", "project"),  # with PROJECT_EARLY_LAUNCH=0: Lightning's launcher starts rank 1
    "torchrun": ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "{port}", "-m", "project"),
}


def alive_with_tag(tag: str) -> list[str]:
    """Command lines of live (not zombie) processes whose environment carries ``FAULT_RUN=tag``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"FAULT_RUN={tag}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # ended while we looked, or not ours to read
            continue
    return found


def run_with_fault(tmp_path: Path, launcher: str, fault: list[str]) -> tuple[object, float, float]:
    """Run the 2-process fit with ``fault``; return the result, when the fault happened and when all ended."""
    tag, stamp = uuid.uuid4().hex, tmp_path / "fault_at"
    module = tuple(a.format(port=free_port()) for a in LAUNCHERS[launcher])
    args = [*FIT, *fault, "--trainer.callbacks.init_args.stamp", str(stamp)]
    env = {"FAULT_RUN": tag, **({"PROJECT_EARLY_LAUNCH": "0"} if launcher == "lightning-launcher" else {})}
    result = run_cli(args, tmp_path, env=env, timeout=240, module=module)
    ended = time.time()
    assert stamp.is_file(), "the fault never happened:\n" + result.stderr[-3000:]
    assert alive_with_tag(tag) == [], "processes of the run are still alive"
    return result, float(stamp.read_text()), ended


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_killed_rank_ends_the_run_and_is_named(tmp_path, launcher):
    kill = ["--trainer.callbacks+=faults.KillAtStep", "--trainer.callbacks.init_args.step", MID_EPOCH_STEP]
    result, killed_at, ended = run_with_fault(tmp_path, launcher, kill)
    assert result.returncode != 0
    assert ended - killed_at < AFTER_KILL_S
    if launcher.startswith("lightning"):
        # Rank 0 started rank 1, so it knows which rank died and how.
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert re.search(r"^error: rank 1 \(pid \d+\) was killed by SIGKILL", result.stderr, re.M), result.stderr
    else:
        # torchrun's own report names the failed worker; rank 0 says whom it lost if it got the chance.
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s+exitcode\s*:\s*-9", result.stderr), result.stderr
        assert "error: rank 0 lost rank 1" in result.stderr or "SIGKILL" in result.stderr


def test_a_stuck_collective_fails_after_the_timeout(tmp_path):
    stuck = ["--trainer.callbacks+=faults.StuckAtStep", "--trainer.callbacks.init_args.step", MID_EPOCH_STEP]
    result, stuck_at, ended = run_with_fault(tmp_path, "lightning", [*stuck, "--parallel.timeout_s", str(TIMEOUT_S)])
    assert result.returncode != 0
    assert ended - stuck_at < TIMEOUT_S + AFTER_TIMEOUT_S
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = f"error: rank 0: a collective did not complete within parallel.timeout_s={TIMEOUT_S} s; rank 1 is stuck"
    assert message in result.stderr, result.stderr
