"""``parallel.precision``: in the plan and in the GPU check script (``parallel.compile``: the compile layer's tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from project.errors import UserError
from project.parallel.strategies import trainer_kwargs
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import REPO, cli_env

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), LOCAL, 64)


def test_the_plan_owns_the_trainers_precision():
    cpu = plan(0, precision="bf16-mixed")
    assert trainer_kwargs(cpu)["precision"] == "bf16-mixed"
    assert cpu.to_dict()["precision"] == "bf16-mixed"
    assert "CPU autocast to bfloat16" in " ".join(cpu.notes)
    gpus = plan(8, scenario="ddp", devices="all", precision="16-mixed")
    assert trainer_kwargs(gpus)["precision"] == "16-mixed" and "gradient scaler" in " ".join(gpus.notes)
    assert plan(0).to_dict()["precision"] == "32"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"precision": "16-mixed"}, ("precision='16-mixed'", "needs GPUs", "bf16-mixed")),
        ({"precision": "16-mixed", "scenario": "cpu", "devices": 2}, ("precision='16-mixed'", "needs GPUs")),
        ({"precision": "8"}, ("precision='8'", "32, 64, bf16-mixed, 16-mixed")),
    ],
)
def test_precision_the_hardware_cannot_run_is_refused(fields, words):
    with pytest.raises(UserError) as error:
        plan(0, **fields)
    for word in words:
        assert word in str(error.value)


def test_gpu_check_refuses_without_a_gpu_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would run")
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: no GPU"), result.stderr
    assert "--cpu-dry-run" in result.stderr and "Traceback" not in result.stderr


def test_bf16_mixed_on_cpu_does_the_raw_loops_autocast_arithmetic(tmp_path):
    """The GPU check's dry run: the template in bf16-mixed ends at the raw bf16-autocast loop's loss."""
    ways = ["--ways", "raw-bf16-mixed,template-bf16-mixed"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu_check",
            "--cpu-dry-run",
            *ways,
            "--out",
            str(tmp_path),
            "--work",
            str(tmp_path),
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (tmp_path / "gpu_check.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith(("| raw |", "| template |"))]
    assert len(rows) == 2 and rows[1].endswith("| same |"), table
    assert all("| bf16-mixed |" in row for row in rows)
