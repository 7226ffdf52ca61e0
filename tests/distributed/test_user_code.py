"""Issue 11: the template's guarantees for code that is not the template's, or a clear refusal before training.

A plain LightningDataModule with its own shuffled DataLoader and a batch argument called ``bs``
(``tests/user_code.py``), a library network (``torch.nn.Linear``), a module that keeps its network at
``.model``, an IterableDataset: each is run through the CLI as a user would, and the run is checked by
what it leaves behind.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from helpers import (
    CPU_DDP,
    DIGITS,
    FAST,
    assert_clean_error,
    has_layer,
    read_plan,
    read_scalars,
    run_cli,
    run_dirs,
    two_at_a_time,
)

PLAIN = ["--data.class_path", "user_code.PlainDigits", "--data.init_args.bs", "16"]
NO_COUPLING = ["--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm", "false"]
SHORT = ["--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1.0", "--test_after_fit", "false"]


def fit(cwd, *args: str, layout: tuple[str, ...] = ()) -> tuple:
    """Fit digits with the plain datamodule in ``cwd``; the run directory and the result."""
    cwd.mkdir(exist_ok=True)
    result = run_cli(["fit", "--config", DIGITS, *layout, "--config", FAST, *PLAIN, *args], cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return run_dirs(cwd)[-1], result


def evaluate(cwd, command: str, checkpoint, *layout: str):
    """Run ``validate``/``test``/``predict`` of ``checkpoint`` with the plain datamodule; its run directory."""
    cwd.mkdir(exist_ok=True)
    before = set(run_dirs(cwd))
    args = [
        command,
        "--config",
        DIGITS,
        *layout,
        "--config",
        FAST,
        *PLAIN,
        *NO_COUPLING,
        "--ckpt_path",
        str(checkpoint),
    ]
    result = run_cli(args, cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (run,) = set(run_dirs(cwd)) - before
    return run


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory) -> dict:
    """The same global batch (32) on 1 and 2 processes, from the plain datamodule whose loader says 16."""
    root = tmp_path_factory.mktemp("plain")
    layouts = {"one": (), "two": ("--config", CPU_DDP)}
    runs = two_at_a_time(
        *(
            partial(fit, root / name, *NO_COUPLING, *SHORT, "--parallel.global_batch_size", "32", layout=layout)
            for name, layout in layouts.items()
        )
    )
    return {name: run for name, (run, _) in zip(layouts, runs, strict=True)}


@pytest.mark.distributed
def test_plain_datamodule_gets_the_global_batch_and_world_size_invariant_weights(plain_runs):
    for run, world in ((plain_runs["one"], 1), (plain_runs["two"], 2)):
        plan = read_plan(run)
        assert (plan["world_size"], plan["global_batch_size"], plan["per_device_batch_size"]) == (
            world,
            32,
            32 // world,
        )
        assert plan["guarantees"]["training"]["held"] and plan["guarantees"]["validation"]["held"], plan
    one = torch.load(plain_runs["one"] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    two = torch.load(plain_runs["two"] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.distributed
def test_plain_datamodule_evaluates_each_sample_once_and_predicts_in_dataset_order(plain_runs, tmp_path):
    last = plain_runs["one"] / "checkpoints" / "last.ckpt"
    metrics, predictions = [], []
    for i, layout in enumerate(((), ("--config", CPU_DDP))):
        tested, predicted = two_at_a_time(
            *(partial(evaluate, tmp_path / f"{command}-{i}", command, last, *layout) for command in ("test", "predict"))
        )
        metrics.append({tag: values[-1][1] for tag, values in read_scalars(tested).items() if tag.startswith("test/")})
        predictions.append((predicted / "predictions.csv").read_text() if has_layer("predictions") else "")
    assert metrics[1] == pytest.approx(metrics[0], abs=1e-6)
    if not has_layer("predictions"):
        return
    # 45 test samples over 2 processes: 23 + 22, none twice; the same rows, in dataset order.
    assert predictions[1] == predictions[0]
    assert len(predictions[0].splitlines()) == 1 + 45
    assert [int(row.split(",")[0]) for row in predictions[0].splitlines()[1:]] == list(range(45))


def test_the_saved_config_is_what_the_user_gave_and_plans_the_same(plain_runs, tmp_path):
    run = plain_runs["one"]
    saved = (run / "config.yaml").read_text()
    assert "bs: 16" in saved and "global_batch_size: 32" in saved
    assert "ckpt_path" not in saved and "test_after_fit" not in saved
    again = run_cli(["plan", "--config", str(run / "config.yaml"), "--json"], tmp_path)
    assert again.returncode == 0, again.stderr
    plan = json.loads(again.stdout)
    assert (plan["global_batch_size"], plan["per_device_batch_size"]) == (32, 32)
    # Under dp the data batch is global: planned from the same file it splits the loader's 16 over 4 GPUs.
    dp = ["--parallel.scenario", "dp", "--parallel.devices", "all", "--parallel.global_batch_size", "null"]
    dp_plan = run_cli(["plan", "--config", str(run / "config.yaml"), *dp, "--assume_gpus", "4", "--json"], tmp_path)
    assert dp_plan.returncode == 0, dp_plan.stderr
    assert json.loads(dp_plan.stdout)["per_device_batch_size"] == 4


def test_a_run_is_tested_from_its_own_config_file(plain_runs, tmp_path):
    run = plain_runs["one"]
    args = ["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in read_scalars(run_dirs(tmp_path)[-1])


def test_a_library_network_is_exported_from_the_config_and_rebuilds(tmp_path):
    linear = ["--model.init_args.net", json.dumps({"class_path": "torch.nn.Linear", "init_args": {"in_features": 64}})]
    linear += ["--model.init_args.net.init_args.out_features", "10"]
    result = run_cli(["fit", "--config", DIGITS, "--config", FAST, *linear, "--trainer.max_epochs", "1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = run_dirs(tmp_path)[-1]
    spec = json.loads((run / "export" / "model.json").read_text())
    assert spec["class_path"] == "torch.nn.Linear" and spec["init_args"]["out_features"] == 10
    assert "test/acc" in read_scalars(run)
    from project.extras.export.weights import rebuild

    assert isinstance(rebuild(run / "export"), torch.nn.Linear)


def test_a_monitored_metric_the_module_never_logs_is_refused_before_training(tmp_path):
    model = {"class_path": "torch.nn.Linear", "init_args": {"in_features": 64, "out_features": 10}}
    args = ["--model.class_path", "user_code.ModelAttributeClassifier", "--model.init_args.model", json.dumps(model)]
    result = run_cli(["fit", "--config", DIGITS, "--config", FAST, *args], tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert_clean_error(result, "BestCheckpoint(monitor='val/acc')", "never logs 'val/acc'", "val/loss")
    assert run_dirs(tmp_path) == []
