"""The character-level GPT under (dp, tp) = (1, 2), (2, 1) and (2, 2) ends where one process ends.

12 AdamW steps of a tiny GPT (dropout 0, no biases) on the same global batch and seed. In float64
(``parallel.precision: 64``) the final weights agree within 1e-9 relative to each tensor's largest value; in
float32 the validation loss within 1e-4 (relative): float32 reorders sums under DDP and TP, and Adam turns the
noise of tiny gradients into full steps, so float32 weights are not the thing to compare.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, CPU_DDP, read_plan, read_scalars, run_cli, run_dirs, two_at_a_time

pytest.importorskip("project.extras.sharding")  # tensor parallelism is the sharding layer's

CHARGPT = str(CONFIGS / "gpt" / "chargpt.yaml")
FSDP = str(CONFIGS / "sharding" / "cpu_fsdp.yaml")
NET = "--model.init_args.net.init_args."
TINY = [
    "--config", CHARGPT,
    f"{NET}n_layer", "1", f"{NET}n_head", "2", f"{NET}n_embd", "16", f"{NET}block_size", "16", f"{NET}dropout", "0",
    "--data.init_args.block_size", "16", "--data.init_args.val_windows", "8", "--parallel.global_batch_size", "8",
    "--trainer.max_steps", "12", "--trainer.val_check_interval", "12", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false", "--test_after_fit", "false",
]  # fmt: skip
F64 = ["--parallel.precision", "64"]
LAYOUTS = {
    "tp": ["--config", CPU_DDP, "--parallel.tensor_parallel.size", "2"],
    "ddp": ["--config", CPU_DDP],
    "2d": ["--config", FSDP, "--parallel.devices", "4", "--parallel.tensor_parallel.size", "2"],
}


def fit(cwd: Path, *extra: str) -> Path:
    """The tiny GPT fit in ``cwd`` with ``extra`` options: its run directory."""
    cwd.mkdir(parents=True)
    result = run_cli(["fit", *TINY, *extra], cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (run,) = run_dirs(cwd, "chargpt")
    return run


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "export" / "model.pt", weights_only=True)


def val_loss(run: Path) -> float:
    return read_scalars(run)["val/loss"][-1][1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpt_tp")
    names = ["one", "one32", "tp", "tp32", "ddp"]
    extras = [F64, [], [*LAYOUTS["tp"], *F64], LAYOUTS["tp"], [*LAYOUTS["ddp"], *F64]]
    done = two_at_a_time(*(partial(fit, root / name, *extra) for name, extra in zip(names, extras)))
    return dict(zip(names, done))


@pytest.fixture(scope="module")
def two_d(tmp_path_factory) -> dict[str, Path]:
    """The 4-process FSDP x TP fit and its one-process reference: fixtures of their own, so that the everyday lane
    (``-m "not slow"``) runs no 4-process fit and the slow lane none of the other layouts."""
    root = tmp_path_factory.mktemp("gpt_2d")
    one, two_d = two_at_a_time(partial(fit, root / "one", *F64), partial(fit, root / "2d", *LAYOUTS["2d"], *F64))
    return {"one": one, "2d": two_d}


@pytest.mark.parametrize("layout", ["tp", "ddp", pytest.param("2d", marks=pytest.mark.slow)])
def test_each_layout_ends_at_the_weights_of_one_process_in_float64(layout, request):
    found = request.getfixturevalue("two_d" if layout == "2d" else "runs")
    run = found[layout]
    one, other = weights(found["one"]), weights(run)
    assert one.keys() == other.keys() and one["lm_head.weight"].dtype == torch.float64
    worst = max(((other[k] - one[k]).abs().max() / one[k].abs().max()).item() for k in one)
    assert worst < 1e-9, worst
    degrees = read_plan(run)["degrees"]
    assert (degrees["dp_replicate"] * degrees["dp_shard"], degrees["tp"]) == {
        "tp": (1, 2),
        "ddp": (2, 1),
        "2d": (2, 2),
    }[layout]


def test_tensor_parallel_in_float32_reaches_the_validation_loss_of_one_process(runs):
    one, tp = val_loss(runs["one32"]), val_loss(runs["tp32"])
    assert abs(tp - one) / one < 1e-4, (tp, one)
