"""``parallel.compile`` and ``parallel.precision``: in the plan, under 2-process DDP, and in the GPU check script.

The compile test uses torch.compile's default backend (inductor, what users get): on 2 CPU cores it compiles the
small digits network twice per rank (evaluation in the sanity check, then training), about 20 s with a cold
inductor cache and a few seconds with a warm one (``/tmp/torchinductor_<user>``).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from project.errors import UserError
from project.models.classifier import Classifier
from project.models.digits_net import DigitsNet
from project.parallel.compile import compile_after_wrap, is_compiled
from project.parallel.strategies import trainer_kwargs
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import CPU_DDP, DIGITS, FAST, REPO, cli_env, read_plan, read_scalars, run_cli, run_dirs

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), LOCAL, 64)


def test_the_plan_owns_the_trainers_precision_and_shows_compile():
    cpu = plan(0, precision="bf16-mixed", compile=True)
    assert trainer_kwargs(cpu)["precision"] == "bf16-mixed"
    data = cpu.to_dict()
    assert data["precision"] == "bf16-mixed" and data["compile"] is True
    notes = " ".join(cpu.notes)
    assert "CPU autocast to bfloat16" in notes and "torch.compile" in notes
    gpus = plan(8, scenario="ddp", devices="all", precision="16-mixed")
    assert trainer_kwargs(gpus)["precision"] == "16-mixed" and "gradient scaler" in " ".join(gpus.notes)
    assert plan(0).to_dict()["precision"] == "32" and plan(0).to_dict()["compile"] is False


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


def test_compile_after_wrap_compiles_the_networks_in_place_and_keeps_plain_keys():
    module = Classifier(DigitsNet(hidden=16))
    keys = list(module.state_dict())
    assert compile_after_wrap(module) == ["net"]  # loss_fn and the metrics hold no parameters
    assert is_compiled(module.net) and not is_compiled(module) and not is_compiled(module.loss_fn)
    assert list(module.state_dict()) == keys and not any("_orig_mod" in key for key in keys)
    compiled = module.net._compiled_call_impl
    compile_after_wrap(module)  # a strategy and the callback may both call it: compiled once
    assert module.net._compiled_call_impl is compiled
    assert not is_compiled(copy.deepcopy(module.net))  # what the export of the best checkpoint copies
    with pytest.raises(UserError, match=r"parallel.compile=true found no network in Linear"):
        compile_after_wrap(nn.Linear(2, 2))


@pytest.mark.distributed
def test_compile_trains_under_two_process_ddp_and_exports_plain_keys(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--config", CPU_DDP, "--parallel.compile", "true"]
    args += ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"]
    # graph_code: TorchDynamo prints each graph it traces, on each rank (proof that compiled code ran).
    result = run_cli(args, tmp_path, env={"TORCH_LOGS": "graph_code"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "torch.compile: net of Classifier compiled in place after DDPStrategy" in result.stdout
    for rank in (0, 1):
        assert any(f"[rank{rank}]" in line and "TRACED GRAPH" in line for line in output.splitlines()), rank
    (run,) = run_dirs(tmp_path)
    assert read_plan(run)["compile"] is True and read_plan(run)["world_size"] == 2
    assert "test/acc" in read_scalars(run)
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    saved = torch.load(best, weights_only=True)["state_dict"]
    assert not any("_orig_mod" in key or key.startswith("module.") for key in saved)
    exported = torch.load(run / "export" / "model.pt", weights_only=True)
    assert list(exported) == list(DigitsNet().state_dict())  # the bare network's own keys
    for key, value in exported.items():
        assert torch.equal(value, saved[f"net.{key}"]), key  # the export is the best checkpoint's network


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
