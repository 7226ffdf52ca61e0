"""Pipeline parallelism (``--parallel.pipeline_parallel.size``) ends where one process ends.

12 AdamW steps of a tiny GPT (4 blocks, dropout 0) on the same global batch and seed: in float64
(``--parallel.precision 64``) pp 2 on 2 processes (1f1b) and pp 2 x dp 2 on 4 (gpipe) end within 1e-9 of one
process (relative to each tensor's largest value); in float32 pp 2's validation loss within 1e-4. A pp 2
checkpoint of step 6 resumes as one process, as 2-process DDP and as pp 2 x dp 2, and ends within 1e-9 of the
straight run; a plain user module that names its own stage boundary trains as a pipeline like one process; a bad
split is one line.
"""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import (
    CONFIGS,
    CPU_DDP,
    assert_clean_error,
    has_layer,
    read_plan,
    read_scalars,
    run_cli,
    run_dirs,
    two_at_a_time,
)

CHARGPT = str(CONFIGS / "gpt" / "chargpt.yaml")  # the gpt layer's; its tests skip without it
NEEDS_GPT = pytest.mark.skipif(not has_layer("gpt"), reason="Requires: the gpt layer")
NET = "--model.init_args.net.init_args."
TINY = [
    "--config", CHARGPT,
    f"{NET}n_layer", "4", f"{NET}n_head", "2", f"{NET}n_embd", "32", f"{NET}block_size", "16", f"{NET}dropout", "0",
    "--data.init_args.block_size", "16", "--data.init_args.val_windows", "8", "--parallel.global_batch_size", "8",
    "--trainer.max_steps", "12", "--trainer.val_check_interval", "12", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false", "--test_after_fit", "false",
]  # fmt: skip
F64 = ["--parallel.precision", "64"]
PP2 = ["--parallel.scenario", "cpu", "--parallel.devices", "2", "--parallel.pipeline_parallel.size", "2"]
PP2_DP2 = [*PP2[:3], "4", *PP2[4:], "--parallel.pipeline_parallel.schedule", "gpipe"]


def fit(cwd: Path, *extra: str, name: str = "chargpt") -> Path:
    """A fit in ``cwd`` (made here) with ``extra`` options: its run directory."""
    cwd.mkdir(parents=True, exist_ok=True)
    result = run_cli(["fit", *TINY, *extra], cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return run_dirs(cwd, name)[-1]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The network's weights in the run's last checkpoint (the whole model, whatever the layout)."""
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")["state_dict"]
    return {key: value for key, value in state.items() if key.startswith("net.")}


def worst(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> float:
    """The largest difference of any tensor, relative to its largest value."""
    assert one.keys() == other.keys() and one["net.lm_head.weight"].dtype == torch.float64
    return max(((other[k] - one[k]).abs().max() / one[k].abs().max()).item() for k in one)


def val_loss(run: Path) -> float:
    return read_scalars(run)["val/loss"][-1][1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipeline")
    names = ["one", "pp2", "one32", "pp2_32", "half"]
    extras = [F64, [*PP2, *F64], [], PP2, [*PP2, *F64, "--trainer.max_steps", "6"]]
    done = two_at_a_time(*(partial(fit, root / name, *extra) for name, extra in zip(names, extras)))
    found = dict(zip(names, done))
    found["pp2_dp2"] = fit(root / "pp2_dp2", *PP2_DP2, *F64)
    return found


@NEEDS_GPT
@pytest.mark.parametrize("layout", ["pp2", "pp2_dp2"])
def test_the_gpt_as_a_pipeline_ends_at_the_weights_of_one_process_in_float64(runs, layout):
    assert worst(final_weights(runs["one"]), final_weights(runs[layout])) < 1e-9
    degrees = read_plan(runs[layout])["degrees"]
    assert (degrees["pp"], degrees["dp_replicate"] * degrees["dp_shard"]) == {"pp2": (2, 1), "pp2_dp2": (2, 2)}[layout]


@NEEDS_GPT
def test_the_pipeline_in_float32_reaches_the_validation_loss_of_one_process(runs):
    one, pp = val_loss(runs["one32"]), val_loss(runs["pp2_32"])
    assert abs(pp - one) / one < 1e-4, (pp, one)


@NEEDS_GPT
@pytest.mark.parametrize(
    "layout", [[*F64], ["--config", CPU_DDP, *F64], [*PP2_DP2, *F64]], ids=["one_process", "ddp", "pp2_dp2"]
)
def test_a_pipeline_checkpoint_resumes_as_another_layout_and_ends_where_the_straight_run_ends(runs, tmp_path, layout):
    copy = tmp_path / "copy"
    shutil.copytree(runs["half"].parents[2], copy)  # cwd/logs/chargpt/version_0: a fresh copy per layout
    resumed = run_cli(["fit", *TINY, *layout, "--ckpt_path", "last"], copy)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "step 6" in resumed.stderr
    assert worst(final_weights(runs["one"]), final_weights(run_dirs(copy, "chargpt")[-1])) < 1e-9


USER = [
    "--model", "user_pipeline.SequentialRegressor", "--data", "user_pipeline.RandomRegression",
    "--trainer.max_steps", "8", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    "--trainer.logger.class_path", "lightning.pytorch.loggers.TensorBoardLogger",
    "--trainer.logger.init_args.save_dir", "logs", "--trainer.logger.init_args.name", "user", *F64,
]  # fmt: skip


@pytest.mark.parametrize("model", ["SequentialRegressor", "BlockListRegressor"])
def test_a_users_own_module_trains_as_a_pipeline_like_one_process(tmp_path, model):
    """Not the bundled GPT: an nn.Sequential that names its boundary, and a block list split evenly (float64)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "pp").mkdir()
    user = [*USER, "--model", f"user_pipeline.{model}"]
    one, pp = two_at_a_time(
        partial(run_cli, ["fit", *user], tmp_path / "one"), partial(run_cli, ["fit", *user, *PP2], tmp_path / "pp")
    )
    for result in (one, pp):
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    weights = [
        torch.load(next((run_dirs(tmp_path / name, "user")[-1] / "checkpoints").glob("*.ckpt")), weights_only=False)
        for name in ("one", "pp")
    ]
    first, second = (w["state_dict"] for w in weights)
    assert first.keys() == second.keys()
    assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-9
    assert read_plan(run_dirs(tmp_path / "pp", "user")[-1])["degrees"]["pp"] == 2


@NEEDS_GPT
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ([f"{NET}n_layer", "1"], "more stages than the 1 blocks of GPT"),
        (["--parallel.pipeline_parallel.split_points", "[blocks.9]"], "'blocks.9' is not a unit of GPT"),
    ],
)
def test_a_split_that_cannot_be_made_is_one_line(tmp_path, extra, needle):
    result = run_cli(["fit", *TINY, *PP2, *extra], tmp_path)
    assert_clean_error(result, needle)
    assert not run_dirs(tmp_path, "chargpt")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--parallel.global_batch_size", "16", "--parallel.per_device_batch_size", "4"], "gradient accumulation 4"),
        (["--model", "user_pipeline.WithoutPipelineLoss"], "WithoutPipelineLoss has no pipeline_loss"),
    ],
    ids=["accumulation", "no_loss"],
)
def test_what_a_pipeline_cannot_run_is_one_line(tmp_path, extra, needle):
    result = run_cli(["fit", *USER, *PP2, *extra], tmp_path)
    assert_clean_error(result, needle)
    assert not run_dirs(tmp_path, "user")


@NEEDS_GPT
def test_predict_through_the_stages_writes_one_process_completions_once_each(runs, tmp_path):
    checkpoint = str(runs["pp2"] / "checkpoints" / "last.ckpt")
    args = ["predict", *TINY[:-2], *F64, "--model.init_args.generate_chars", "8", "--ckpt_path", checkpoint]
    (tmp_path / "one").mkdir()
    (tmp_path / "pp").mkdir()
    one, pp = two_at_a_time(partial(run_cli, args, tmp_path / "one"), partial(run_cli, [*args, *PP2], tmp_path / "pp"))
    for result in (one, pp):
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    written = [(run_dirs(tmp_path / name, "chargpt")[-1] / "predictions.csv").read_text() for name in ("one", "pp")]
    assert written[0] == written[1] and written[0].count("\n") > 3
