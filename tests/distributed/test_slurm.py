"""A real SLURM: scripts/slurm/train.sbatch submitted to a one-node cluster started on this machine.

The cluster is Debian's slurm-wlm (slurmctld + slurmd, authenticated by its own munged), configured in a temporary
folder on free ports, and stopped at the end. Skipped, with the reason, where SLURM is not installed or cannot
start; tests/distributed/test_launchers.py checks SLURM's variables without a cluster.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CPU_DDP, FAST, REPO, cli_env, free_port, read_plan, read_scalars, run_dirs, stop_tree

pytestmark = pytest.mark.distributed
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"


def _conf(folder: Path, user: str) -> str:
    host = socket.gethostname().split(".")[0]
    return f"""\
ClusterName=template-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A one-node SLURM cluster (munged, slurmctld, slurmd); yields the environment that points sbatch at it."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"SLURM is not installed here (no {', '.join(missing)}; apt-get install slurm-wlm)")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder, getpass.getuser()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = [f"--key-file={key}", f"--socket={folder}/munge.sock", f"--pid-file={folder}/munged.pid"]
    munge += [f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed"]
    commands = (
        ["munged", "--foreground", "--force", *munge],
        ["slurmctld", "-D", "-f", str(conf)],
        ["slurmd", "-D", "-f", str(conf)],
    )
    daemons: list[subprocess.Popen] = []
    try:
        for command in commands:
            with (folder / f"{command[0]}.out").open("w") as log:
                daemons.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
            if command[0] == "munged":
                _wait(lambda: (folder / "munge.sock").exists(), daemons, folder, "munged")
        _wait(lambda: _idle(env), daemons, folder, "the node")
        yield {"SLURM_CONF": str(conf)}
    finally:
        stop_tree(*daemons)


def _idle(env: dict[str, str]) -> bool:
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    return state.stdout.strip() == "idle"


def _wait(ready, daemons: list[subprocess.Popen], folder: Path, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        ended = [d.args[0] for d in daemons if d.poll() is not None]
        if ended or time.monotonic() > deadline:
            logs = " | ".join(p.read_text()[-300:].replace("\n", " ") for p in sorted(folder.glob("*.out")))
            pytest.skip(f"a one-node SLURM could not start here ({what} not ready; ended: {ended or 'none'}): {logs}")
        time.sleep(0.3)


def test_sbatch_script_runs_two_tasks_with_srun(slurm, tmp_path):
    # The script's relative paths, from the submit folder; the run directory lands there too.
    (tmp_path / "configs").symlink_to(REPO / "configs")
    # On CPU: 2 tasks over gloo in place of the script's GPUs (the later --config replaces its parallel section).
    fit = ["--config", CPU_DDP, "--config", FAST, "--trainer.max_steps", "6", "--trainer.limit_val_batches", "2"]
    options = ["--wait", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gres=none"]
    options += [f"--output={tmp_path}/slurm-%j.out"]
    env = cli_env({**slurm, "PYTHON": sys.executable})
    result = subprocess.run(
        ["sbatch", *options, str(SBATCH), *fit], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    (log,) = tmp_path.glob("slurm-*.out")
    output = result.stdout + result.stderr + log.read_text()
    assert result.returncode == 0, output[-5000:]
    (run,) = run_dirs(tmp_path)
    assert f"Run directory: logs/digits/{run.name}" in output
    plan = read_plan(run)
    assert (plan["launcher"], plan["world_size"], plan["num_nodes"]) == ("slurm", 2, 1), plan
    assert plan["launch"]["ranks_on_this_node"] == [0, 1]
    assert plan["runtime"]["cluster_environment"] == "SLURMEnvironment", plan["runtime"]
    assert plan["runtime"]["world_size"] == 2
    assert "test/acc" in read_scalars(run)


def _sbatch(slurm: dict[str, str], cwd: Path, fit: list[str], *options: str) -> subprocess.CompletedProcess[str]:
    options = ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gres=none", *options)
    env = cli_env({**slurm, "PYTHON": sys.executable})
    return subprocess.run(
        ["sbatch", *options, str(SBATCH), *fit], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _until(condition, timeout_s: float, what: str, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s\n{detail()}"
        time.sleep(0.2)


def test_a_job_signalled_by_slurm_saves_requeues_itself_and_ends_at_the_uninterrupted_weights(slurm, tmp_path):
    """`scancel --signal=USR1` (what `--signal=USR1@90` sends before the time limit): the tasks stop at one step,
    save it and exit 75; the script requeues the job, which resumes and ends where an uninterrupted job ends."""
    import torch

    fit = ["--config", CPU_DDP, "--config", FAST, "--trainer.max_steps", "30", "--trainer.limit_val_batches", "2"]
    fit += ["--trainer.max_epochs", "4", "--test_after_fit", "false"]
    straight, signalled = tmp_path / "straight", tmp_path / "signalled"
    for cwd in (straight, signalled):
        cwd.mkdir()
        (cwd / "configs").symlink_to(REPO / "configs")
    done = _sbatch(slurm, straight, fit, "--wait", f"--output={straight}/slurm-%j.out")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = signalled / "step.txt"
    slow = {"class_path": "preempt_faults.StepFile", "init_args": {"path": str(steps), "delay_s": 0.2}}
    submitted = _sbatch(
        slurm,
        signalled,
        [*fit, "--trainer.callbacks+=" + __import__("json").dumps(slow)],
        "--parsable",
        "--export=ALL,REQUEUE_ON_PREEMPT=1",
        f"--output={signalled}/slurm-%j.out",
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    _until(lambda: steps.exists() and int(steps.read_text() or 0) >= 8, 120, "training reached step 8")
    subprocess.run(["scancel", "--signal=USR1", job], env={**os.environ, **slurm}, check=True, timeout=30)
    queued = {**os.environ, **slurm}

    def finished() -> bool:
        state = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%T", "-j", job], env=queued, capture_output=True, text=True
        )
        # Only an answer counts: a busy slurmctld answers nothing (and a non-zero status), which is no end state;
        # and only the requeued job's end: right after the requeue squeue may still show the first run's state.
        ended = state.returncode == 0 and state.stdout.strip() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
        logs = list(signalled.glob("slurm-*.out"))
        return ended and bool(logs) and "Resuming from" in logs[0].read_text()

    signalled_at = time.monotonic()

    def job_log() -> str:
        logs = list(signalled.glob("slurm-*.out"))
        return logs[0].read_text() if logs else ""

    def requeued() -> bool:
        state = subprocess.run(["squeue", "-h", "-o", "%T", "-j", job], env=queued, capture_output=True, text=True)
        return "PENDING" in state.stdout or "Resuming from" in job_log()  # waiting, or already started again

    def detail() -> str:
        state = subprocess.run(["scontrol", "show", "job", job], env=queued, capture_output=True, text=True)
        return f"scontrol: {state.stdout[-1500:]}{state.stderr[-500:]}\nlog: {job_log()[-3000:]}"

    # Requeued, the job waits SLURM's requeue delay: its begin time is the credential lifetime away (cred_expire,
    # 120 s by default, 10 s in this cluster's slurm.conf). Started sooner ("StartTime=now"), slurmd refuses it
    # while the first run's revoked credential lives ("Job credential revoked") and the job just ends. Its first
    # run stops within the stop grace (20 s), a busy slurmctld takes its time to requeue: 180 s of slack.
    _until(requeued, 180, "the job was requeued", detail)
    _until(finished, 240, "the requeued job finished", detail)
    print(f"requeued job finished {time.monotonic() - signalled_at:.1f} s after the signal")
    log = next(signalled.glob("slurm-*.out")).read_text()
    assert log.count("error: stopped by SIGUSR1") == 1 and "Resuming from" in log, log[-5000:]
    last = signalled / "logs/digits/version_0/checkpoints/last.ckpt"
    want = torch.load(straight / "logs/digits/version_0/checkpoints/last.ckpt", weights_only=True)
    got = torch.load(last, weights_only=True)
    assert got["global_step"] == want["global_step"] == 30
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, atol=1e-6, rtol=0.0, msg=key)
