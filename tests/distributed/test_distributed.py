"""Real multi-process runs on CPU over gloo: the parallel layer, exactly-once evaluation, the callbacks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import (
    CONFIGS,
    CPU_DDP,
    DIGITS,
    FAST,
    REPO,
    cli_env,
    read_plan,
    read_scalars,
    run_cli,
    run_dirs,
    two_at_a_time,
)

pytestmark = pytest.mark.distributed
FORK = str(CONFIGS / "parallel" / "fork.yaml")  # docs/adding-a-scenario.md


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    """The issue's command: digits on 2 CPU processes (fit, then test of the best checkpoint)."""
    cwd = tmp_path_factory.mktemp("ddp")
    result = run_cli(["fit", "--config", DIGITS, "--config", CPU_DDP], cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = run_dirs(cwd)
    return run


def test_cpu_ddp_fit_runs_two_processes_and_reaches_accuracy(ddp_run):
    plan = read_plan(ddp_run)
    assert plan["world_size"] == 2 and plan["runtime"]["world_size"] == 2
    assert plan["backend"] == "gloo" and plan["strategy"]["ddp"]["broadcast_buffers"] is False
    assert read_scalars(ddp_run)["test/acc"][-1][1] >= 0.93


def test_barrier_waits_are_logged(ddp_run):
    tags = set(read_scalars(ddp_run))
    for point in ("setup", "fit_start", "train_epoch_end", "validation_epoch_end", "test_start", "fit_end"):
        assert f"barrier/{point}/wait_s_max" in tags and f"barrier/{point}/wait_s_min" in tags, sorted(tags)


def test_export_is_bare_and_rebuilds_to_the_logged_accuracy_without_lightning(ddp_run):
    state = torch.load(ddp_run / "export" / "model.pt", weights_only=True)
    assert state and not any(k.startswith(("module.", "net.", "_forward_module.")) for k in state)
    code = (
        "import sys, torch\n"
        "from project.data.arrays import load_digits_tensors, seeded_split, split_sizes\n"
        "from project.extras.export.weights import rebuild\n"
        f"net = rebuild({str(ddp_run / 'export')!r})\n"
        "x, y = load_digits_tensors()\n"
        "_, _, test = seeded_split(x, y, split_sizes(len(x), 0.15, 0.15), seed=0)\n"
        "with torch.no_grad():\n"
        "    acc = (net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()\n"
        "assert not any(m.startswith(('lightning', 'pytorch_lightning')) for m in sys.modules)\n"
        "print(acc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True)
    logged = read_scalars(ddp_run)["test/acc"][-1][1]
    assert float(out.stdout) == pytest.approx(logged, abs=1e-6)


def validate(cwd: Path, ckpt: Path, *configs: str) -> dict[str, float]:
    before = set(run_dirs(cwd))
    args = ["validate", "--config", DIGITS, *(a for c in configs for a in ("--config", c)), "--ckpt_path", str(ckpt)]
    result = run_cli(args, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = set(run_dirs(cwd)) - before
    scalars = read_scalars(run)
    return {tag: scalars[tag][-1][1] for tag in ("val/acc", "val/loss")}


def test_evaluation_counts_every_sample_once_and_matches_one_process(ddp_run, tmp_path):
    last = ddp_run / "checkpoints" / "last.ckpt"
    single = validate(tmp_path, last)
    double = validate(tmp_path, last, CPU_DDP)
    assert double == pytest.approx(single, abs=1e-6)
    # The unwrapped evaluation inside the 2-process fit, at the step the checkpoint was saved, saw the
    # same weights and reports the same as one process.
    step = torch.load(last, weights_only=True)["global_step"]
    logged = read_scalars(ddp_run)
    for tag in ("val/acc", "val/loss"):
        at_step = [value for s, value in logged[tag] if s == step - 1 or s == step]
        assert at_step and at_step[-1] == pytest.approx(single[tag], abs=1e-6), (tag, step, logged[tag])


# The same global batch of 32 at any world size; no dropout or batch norm, so 1 and 2 processes compute the same.
SAME_GLOBAL = [
    "--config", FAST, "--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm",
    "false", "--parallel.global_batch_size", "32", "--test_after_fit", "false", "--trainer.limit_val_batches", "1",
]  # fmt: skip


def same_global_fit(cwd: Path, *layout: str) -> tuple[dict[str, torch.Tensor], list[tuple[int, float]]]:
    """The weights and ``train/loss`` of the SAME_GLOBAL fit on ``layout`` (a config right after digits.yaml)."""
    result = run_cli(["fit", "--config", DIGITS, *layout, *SAME_GLOBAL], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(cwd)
    plan = read_plan(run)
    assert plan["global_batch_size"] == 32 and plan["per_device_batch_size"] == 32 // plan["world_size"]
    weights = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    return weights, read_scalars(run)["train/loss"]


@pytest.fixture(scope="module")
def one_process_weights(tmp_path_factory) -> tuple[dict[str, torch.Tensor], list[tuple[int, float]]]:
    """The reference: the SAME_GLOBAL fit on one process, shared by both layouts below."""
    return same_global_fit(tmp_path_factory.mktemp("one_process"))


@pytest.mark.fast
@pytest.mark.parametrize("layout", [CPU_DDP, FORK], ids=["ddp", "fork"])
def test_same_global_batch_gives_same_weights_at_world_size_1_and_2(tmp_path, layout, one_process_weights):
    (one, one_loss), (two, two_loss) = one_process_weights, same_global_fit(tmp_path, "--config", layout)
    assert one.keys() == two.keys()
    for key in one:
        assert not torch.equal(one[key], torch.zeros_like(one[key]))
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6, msg=key)
    # The logged curve is the global batch's mean too, not rank 0's half batch: the same curve at 1 and 2.
    assert [step for step, _ in two_loss] == [step for step, _ in one_loss] and len(one_loss) > 1
    assert [loss for _, loss in two_loss] == pytest.approx([loss for _, loss in one_loss], abs=1e-6)


def test_a_late_rank_fails_the_run_naming_it(tmp_path):
    late = str(REPO / "tests" / "configs" / "late_rank.yaml")
    start = time.monotonic()
    result = run_cli(["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", late], tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "barrier 'setup'" in output and "1" in output.split("barrier 'setup'")[1], output[-3000:]
    # The bound: the run ends within the barrier timeout (10 s) + 30 s, plus process start-up.
    assert elapsed < 10 + 30 + 15, elapsed


def test_a_barrier_waits_no_longer_than_the_runs_timeout(tmp_path):
    """BarrierCallback(timeout_s=300) under parallel.timeout_s 10: a late rank ends the run as any collective would."""
    late = tmp_path / "late.yaml"
    text = (REPO / "tests" / "configs" / "late_rank.yaml").read_text()
    late.write_text(text.replace("timeout_s: 10", "timeout_s: 300"))
    start = time.monotonic()
    args = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", str(late), "--parallel.timeout_s", "10"]
    result = run_cli(args, tmp_path, timeout=200)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "barrier 'setup'" in output and "(timeout 10 s)" in output, output[-3000:]
    assert elapsed < 10 + 30 + 15, elapsed


def test_accumulation_reaches_the_weights_of_the_whole_global_batch(tmp_path):
    """1 x 64, 2 x 32, 1 x (4 micro-batches of 16), 2 x (2 x 16): one global batch of 64 per step, the same weights."""
    common = ["fit", "--config", DIGITS, "--config", FAST, "--model.init_args.net.init_args.dropout", "0"]
    common += ["--model.init_args.net.init_args.batch_norm", "false", "--parallel.global_batch_size", "64"]
    common += ["--trainer.max_epochs", "1", "--test_after_fit", "false", "--trainer.limit_val_batches", "1"]
    per_device_16 = ["--parallel.per_device_batch_size", "16"]
    syncs = tmp_path / "syncs.txt"
    recorder = json.dumps({"class_path": "user_code.SyncRecorder", "init_args": {"path": str(syncs)}})
    # (layout config, right after digits.yaml, whose `parallel:` replaces the section; overrides after all)
    layouts = {
        "whole": ([], []),
        "two": (["--config", CPU_DDP], []),
        "accumulated": ([], per_device_16),
        "two-accumulated": (["--config", CPU_DDP], [*per_device_16, f"--trainer.callbacks+={recorder}"]),
    }
    for name in layouts:
        (tmp_path / name).mkdir()
    results = two_at_a_time(
        *(
            partial(run_cli, [*common[:3], *layout, *common[3:], *overrides], tmp_path / name)
            for name, (layout, overrides) in layouts.items()
        )
    )
    weights, plans = {}, {}
    for name, result in zip(layouts, results, strict=True):
        assert result.returncode == 0, result.stderr[-3000:]
        (run,) = run_dirs(tmp_path / name)
        plans[name] = read_plan(run)
        checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        weights[name] = (checkpoint["global_step"], checkpoint["state_dict"])
    got = [(p["world_size"], p["per_device_batch_size"], p["accumulation"]) for p in plans.values()]
    assert got == [(1, 64, 1), (2, 32, 1), (1, 16, 4), (2, 16, 2)]
    step, whole = weights["whole"]
    assert step == 1257 // 64
    # DDP skipped the all-reduce on the first micro-batch of every step (Lightning's no_sync path).
    assert syncs.read_text().split() == ["False", "True"] * step
    for name in ("two", "accumulated", "two-accumulated"):
        other_step, other = weights[name]
        assert other_step == step, name
        for key in whole:
            torch.testing.assert_close(other[key], whole[key], rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
