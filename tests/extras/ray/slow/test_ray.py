"""Ray Train as the launcher: the same command as a Ray Train job on a local Ray cluster of 2 CPUs.

The cluster is started here with Ray's own ``ray start --head`` (2 CPUs, no dashboard) and stopped at the end;
the command connects to it through ``RAY_ADDRESS``, as on any Ray cluster, and is checked the way the other
launchers are: plan.json, test/acc, checkpoints and the export.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from project.data.arrays import load_digits_tensors, seeded_split, split_sizes

from helpers import (
    CPU_DDP,
    DIGITS,
    FAST,
    cli_env,
    free_port,
    read_plan,
    read_scalars,
    run_cli,
    run_dirs,
    stop_tree,
)

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed here (pip install -e .[ray])", allow_module_level=True)

pytestmark = pytest.mark.distributed
FIT = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--parallel.launcher", "ray"]
SHORT = ["--trainer.max_steps", "6", "--trainer.limit_val_batches", "2"]
RAY = str(Path(sys.executable).with_name("ray"))


def _weights():
    """The export layer's writer and ``rebuild`` (a test that uses them skips without that layer)."""
    return pytest.importorskip("project.extras.export.weights")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A local Ray cluster of 2 CPUs, started with `ray start --head` and stopped afterwards.

    Its HOME is a temporary folder, so Ray's files (its session, ~/ray_results) stay out of the machine's.
    Yields the environment that points a command at it.
    """
    home = tmp_path_factory.mktemp("ray")
    env = {"HOME": str(home), "RAY_ADDRESS": f"127.0.0.1:{free_port()}"}
    log = home / "head.log"
    port = env["RAY_ADDRESS"].rsplit(":", 1)[1]
    head_args = ["start", "--head", "--block", "--num-cpus", "2", "--include-dashboard", "false", "--port", port]
    # Ray's socket paths must stay under 107 bytes: its session goes in a short folder of /tmp, not in pytest's
    # (pytest-xdist adds popen-gwN/ to it).
    session = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    head_args += ["--temp-dir", session, "--disable-usage-stats"]
    with log.open("w") as out:
        head_env = {k: v for k, v in cli_env({"HOME": env["HOME"]}).items() if k != "RAY_ADDRESS"}
        head = subprocess.Popen(
            [RAY, *head_args], env=head_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield env
    finally:
        stop_tree(head, grace_s=5)  # `ray start --block` waits out SIGTERM; its processes end on SIGKILL
        shutil.rmtree(session, ignore_errors=True)


def digits_test_accuracy(export: Path) -> float:
    """The accuracy of the exported network, rebuilt without Lightning, on the digits test split."""
    net = _weights().rebuild(export)
    x, y = load_digits_tensors()
    _, _, test = seeded_split(x, y, split_sizes(len(x), 0.15, 0.15), seed=0)
    with torch.no_grad():
        return (net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()


@pytest.mark.slow
def test_fit_runs_as_a_ray_train_job_of_two_workers(ray_cluster, tmp_path):
    result = run_cli([*FIT, *SHORT], tmp_path, ray_cluster, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    (run,) = run_dirs(tmp_path)  # one run directory: only rank 0 wrote, the driver none
    assert f"Run directory: logs/digits/{run.name}" in result.stdout.splitlines(), output[-3000:]
    plan = read_plan(run)
    assert (plan["launcher"], plan["world_size"], plan["backend"]) == ("ray", 2, "gloo"), plan
    assert plan["cluster_environment"] == "ray.train.lightning.RayLightningEnvironment"
    runtime = plan["runtime"]
    assert (runtime["world_size"], runtime["cluster_environment"]) == (2, "RayLightningEnvironment"), runtime
    assert all(plan["guarantees"][stage]["held"] for stage in ("training", "validation", "test")), plan["guarantees"]
    assert plan["global_batch_size"] == 2 * plan["per_device_batch_size"]
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # Exactly-once evaluation over the two workers: the logged test accuracy is the exported network's own.
    logged = read_scalars(run)["test/acc"][-1][1]
    assert digits_test_accuracy(run / "export") == pytest.approx(logged, abs=1e-6)


def test_a_failed_job_is_one_line_naming_the_worker_where_it_started():
    # What Ray Train 2.60 reported for a real run whose rank 1 was SIGKILLed at step 2 (faults.KillAtStep): rank 1's
    # health check failed, and rank 0 lost its peer in the next all-reduce.
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from project.errors import RankFailure, RunFailure, UserError
    from project.extras.ray.job import failure_from_ray

    died = RuntimeError("The actor died unexpectedly before finishing this task.\n\tpid: 4242\n\tip: 10.0.0.2")
    lost = RankFailure("rank 0 lost rank 1 during a collective: that rank died or was killed (Connection reset)")
    killed = {0: lost, 1: WorkerHealthCheckFailedError("A worker health check failed.", died)}
    failure = failure_from_ray(WorkerGroupError("2 workers failed", killed), 2)
    assert isinstance(failure, RunFailure) and str(failure).startswith("rank 1 of 2 Ray workers died (pid 4242): ")
    # A worker's bad input stays bad input (exit code 2), named by the first rank that found it.
    refused = {1: UserError("the dataset has 1257 samples"), 0: UserError("the dataset has 1257 samples")}
    failure = failure_from_ray(WorkerGroupError("2 workers failed", refused), 2)
    assert isinstance(failure, UserError) and str(failure) == "rank 0 of 2 Ray workers: the dataset has 1257 samples"
    crashed = {1: ValueError("bad value in a user callback\nmore"), 0: lost}
    failure = failure_from_ray(WorkerGroupError("2 workers failed", crashed), 2)
    assert str(failure).startswith("rank 1 of 2 Ray workers failed: ValueError: bad value in a user callback (its")
    assert failure_from_ray(KeyboardInterrupt(), 2) is None
