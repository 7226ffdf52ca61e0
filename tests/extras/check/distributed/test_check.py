"""``python -m project check``: the self-test on 1 process, 2 processes under each launcher, and its fire drills."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from test_launchers import TORCHRUN, finish, start_cli

from helpers import CPU_DDP, DIGITS, assert_clean_error, free_port, run_cli

CHECK = ["check", "--config", DIGITS, "--steps", "5"]


def run_drill(cwd, fault: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], float | None]:
    """Run a 2-process check with the fire drill ``fault``: its result and the seconds from the fault to the end
    (``None`` if the rank was stopped before its fault: rank 0 named it first)."""
    stamp = cwd / "fault.time"
    env = {"PROJECT_CHECK_FAULT": fault, "PROJECT_CHECK_FAULT_STAMP": str(stamp)}
    result = run_cli([*CHECK, "--config", CPU_DDP, "--out", "check.json", *extra], cwd, env=env)
    return result, time.time() - float(stamp.read_text()) if stamp.is_file() else None


def read_check(cwd) -> dict:
    return json.loads((cwd / "check.json").read_text())


def assert_passed(report: dict, world_size: int) -> None:
    assert report["ok"] and report["failures"] == [], report
    assert report["world_size"] == world_size and [r["rank"] for r in report["ranks"]] == list(range(world_size))
    assert all(r["step_s"] > 0 and 0 < r["compute_s"] <= r["step_s"] for r in report["ranks"]), report["ranks"]
    assert report["sampling_ok"] is True
    if world_size > 1:
        assert report["values_ok"] and report["all_reduce"] == [world_size * (world_size + 1) / 2] * 2
        assert [row["bytes"] for row in report["bandwidth"]] == [4, 256 * 1024, 4 * 1024**2, 16 * 1024**2]
        assert all(row["time_us"] > 0 for row in report["bandwidth"])
        assert len(report["weight_difference"]) == world_size and max(report["weight_difference"]) <= 1e-5


def test_check_on_one_process_writes_only_its_report(tmp_path):
    result = run_cli(CHECK, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "check passed" in result.stdout and "every rank joined" in result.stdout, result.stdout
    assert_passed(read_check(tmp_path), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.json"]  # no logs/, no config.yaml, no checkpoint


@pytest.mark.fast
def test_check_on_two_processes_with_lightnings_launcher(tmp_path):
    result = run_cli([*CHECK, "--config", CPU_DDP, "--out", "reports/check.json"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_passed(read_check(tmp_path / "reports"), 2)
    assert re.search(r"all-reduce 16 MiB\s*│\s*[\d,]+ us, bus [\d.]+ GB/s", result.stdout), result.stdout


def test_check_runs_its_invariance_probe_under_the_tensor_parallel_layout(tmp_path):
    pytest.importorskip("project.extras.sharding")  # tensor parallelism is the sharding layer's
    tp = ["--parallel.tensor_parallel.size", "2", "--model.init_args.net.init_args.batch_norm", "false"]
    result = run_cli([*CHECK, "--config", CPU_DDP, *tp, "--out", "check.json"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TP weights = 1-process weights" in result.stdout, result.stdout
    report = read_check(tmp_path)
    assert_passed(report, 2)
    assert report["parallel_weights"] == "TP"


def test_check_under_torchrun(tmp_path):
    launcher = [*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "project"]
    result = run_cli([*CHECK, "--config", CPU_DDP], tmp_path, module=launcher)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_passed(read_check(tmp_path), 2)


def test_check_on_two_simulated_nodes_with_torchrun_rendezvous(tmp_path):
    rendezvous = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "check-two-nodes"]
    args = [*CHECK, "--config", CPU_DDP, "--parallel.devices", "1"]  # one process on each "node"
    agents = [start_cli(args, tmp_path, {}, (*TORCHRUN, *rendezvous, "-m", "project")) for _ in range(2)]
    finish(agents)
    assert_passed(read_check(tmp_path), 2)


def test_a_rank_sending_a_wrong_value_is_named_with_its_host_and_device(tmp_path):
    result, seconds = run_drill(tmp_path, "1:value")
    assert seconds is not None and seconds < 30  # the bound, from the fault to the end of the run
    assert_clean_error(result, "error: check failed: rank 1 (host ", ", device cpu) sent a wrong value")
    report = read_check(tmp_path)
    assert not report["ok"] and report["values_ok"] is False and len(report["failures"]) == 1, report


def test_a_rank_that_never_joins_is_named_within_the_join_timeout(tmp_path):
    result, seconds = run_drill(tmp_path, "1:exit", "--join_timeout_s", "20")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # Lightning's launcher sees its child end and stops the run ("[rank: 1] Child process ... terminated with
    # code 3"), the template's own start of the ranks names it ("rank 1 (pid N) exited with code 3"), or, on a
    # machine so loaded that rank 1 is not even started after the join timeout, rank 0 names the missing rank:
    # either way rank 1, never a hang.
    named = (
        re.search(r"\[rank: 1\] Child process with PID \d+ terminated with code 3", output)
        or re.search(r"^error: rank 1 \(pid \d+\) exited with code 3", output, re.M)
        or re.search(r"error: rank 0: a collective did not complete within --join_timeout_s=20 s; rank 1 ", output)
    )
    assert named, output
    assert seconds is None or seconds < 30, seconds
    assert not (tmp_path / "check.json").exists()


def test_bad_check_options_are_one_line(tmp_path):
    assert_clean_error(run_cli([*CHECK, "--steps", "0"], tmp_path), "--steps=0 must be >= 1")
