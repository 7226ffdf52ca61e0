"""``trainer.limit_*_batches`` mean the same samples at any world size, ``plan`` says how many, and a limit that
makes validation unreachable is one line before training (a stream's, found only at its end, is validated there).

The sampler math is checked against Lightning's own per-process rule; the rest are real CLI runs.
"""

from __future__ import annotations

import csv
import json
import math
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

# Lightning's own count of a loader's batches under a limit: what the per-process Trainer limit keeps.
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage

from project.errors import UserError
from project.parallel.limits import (
    EndAwareStream,
    evaluation_limit,
    refuse_unreachable_validation,
    stream_limit,
    training_limit,
)
from project.parallel.samplers import EvalShardSampler, GlobalBatchSampler
from project.parallel.stream import GlobalBatchStream

from helpers import CPU_DDP, DIGITS, FAST, has_layer, read_plan, read_scalars, run_cli, run_dirs, two_at_a_time

VAL = RunningStage.VALIDATING


def _lifted(limit: int | float) -> int | float:
    """The Trainer's per-process limit while the layer's narrowed shards are in use (a fraction: lifted to 1.0)."""
    return limit if isinstance(limit, int) else 1.0


@pytest.mark.parametrize("limit", [3, 7, 1, 0.7, 0.5, 1.0])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_a_limit_shards_the_same_first_samples_once_at_any_world_size(limit, world):
    """270 samples in batches of 64: the ranks' shards, in order, are the first samples the limit keeps, and the
    Trainer's per-process limit (Lightning's rule) keeps every batch of each shard."""
    kept = evaluation_limit("limit_val_batches", limit, 270, 64, world)
    seen = []
    for rank in range(world):
        shard = list(EvalShardSampler(range(270), num_replicas=world, rank=rank, num_samples=kept.samples))
        batches = math.ceil(len(shard) / 64)
        assert _parse_num_batches(VAL, batches, _lifted(limit)) == batches, (rank, len(shard))
        seen += shard
    assert seen == list(range(kept.samples))
    assert list(kept.shards) == [len(EvalShardSampler(range(270), world, r, kept.samples)) for r in range(world)]


@pytest.mark.parametrize(("size", "batch"), [(270, 64), (45, 16), (64, 64), (1, 8)])
@pytest.mark.parametrize("limit", [1, 3, 100, 0.25, 0.5, 0.99, 1.0])
def test_a_limit_keeps_the_batches_lightning_keeps_on_one_process(size, batch, limit):
    batches = math.ceil(size / batch)
    try:
        want = _parse_num_batches(VAL, batches, limit)
    except Exception:  # Lightning refuses a fraction of less than one batch: so does the layer
        with pytest.raises(UserError, match="less than one batch"):
            evaluation_limit("limit_val_batches", limit, size, batch, 2)
        return
    kept = evaluation_limit("limit_val_batches", limit, size, batch, 2)
    assert kept.batches == want and kept.samples == min(size, want * batch)


def test_limit_train_batches_counts_global_batches_at_any_world_size():
    """Each rank has one batch per global batch: Lightning's per-process count keeps the same global batches."""
    trained = {}
    for world in (1, 2, 4):
        kept_by_rank = []
        for rank in range(world):
            sampler = GlobalBatchSampler(range(1257), 32 // world, num_replicas=world, rank=rank, seed=3)
            per_rank = len(sampler) // sampler.batch_size
            assert per_rank == sampler.num_global_batches == 39
            keep = _parse_num_batches(RunningStage.TRAINING, per_rank, 5)
            kept_by_rank.append(list(sampler)[: keep * sampler.batch_size])
        b = 32 // world
        trained[world] = [i for k in range(5) for share in kept_by_rank for i in share[k * b : (k + 1) * b]]
    assert trained[1] == trained[2] == trained[4] and len(trained[1]) == 5 * 32
    assert training_limit(5, 39, 32).samples == 160 and training_limit(0.5, 39, 32).batches == 19


def test_a_val_check_interval_beyond_an_epoch_is_refused():
    def settings(**kw):
        base = {"val_check_interval": 25, "check_val_every_n_epoch": 1, "limit_val_batches": 1.0}
        return SimpleNamespace(**{**base, "limit_train_batches": 1.0, **kw})

    with pytest.raises(UserError, match=r"val_check_interval=25 is more than the 19 training batches"):
        refuse_unreachable_validation(settings(), 19)
    with pytest.raises(UserError, match=r"the 10 training batches of an epoch \(limit_train_batches=10 of its 39"):
        refuse_unreachable_validation(settings(limit_train_batches=10), 39)
    refuse_unreachable_validation(settings(), 25)  # reachable: the 25th batch
    refuse_unreachable_validation(settings(check_val_every_n_epoch=None), 19)  # counts across epochs
    refuse_unreachable_validation(settings(limit_val_batches=0), 19)  # no validation asked for
    refuse_unreachable_validation(settings(val_check_interval=1.0), 19)  # a fraction of the epoch


def test_a_fraction_of_a_stream_is_refused():
    with pytest.raises(UserError, match=r"limit_train_batches=0.5 is a fraction of a training stream"):
        stream_limit(0.5, 32)
    assert stream_limit(7, 32).samples == 224 and stream_limit(1.0, 32).samples is None


def test_the_end_aware_stream_knows_its_end_while_its_last_sample_is_read():
    stream = list(range(40))  # 2 x 2 per micro-step, accumulation 2: 5 optimizer steps of 8
    plain, aware = GlobalBatchStream(stream, 2, 2, 1, 2), EndAwareStream(stream, 2, 2, 1, 2)
    assert list(aware) == list(plain)
    samples = iter(aware)
    for _ in range(len(list(plain)) - 1):
        next(samples)
        assert not aware.exhausted
    next(samples)
    assert aware.exhausted  # before the loader asks for more: Lightning decides validation with this batch


# ------------------------------------------------------------------------------------------------ CLI runs
def configs(*layout: str) -> list[str]:
    """digits.yaml, a layout config right after it (its `parallel:` replaces the section), the test suite's shrink."""
    return ["--config", DIGITS, *layout, "--config", FAST]


QUIET = configs()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """A checkpoint of 5 training steps (1 process)."""
    cwd = tmp_path_factory.mktemp("weights")
    args = ["fit", *QUIET, "--trainer.max_steps", "5", "--trainer.limit_val_batches", "1", "--test_after_fit", "false"]
    result = run_cli(args, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return str(run_dirs(cwd)[-1] / "checkpoints" / "last.ckpt")


def _validate(weights: str, cwd: Path, layout: tuple[str, ...], *extra: str) -> tuple[float, dict]:
    """``validate`` the checkpoint: its val/loss and plan.json's validation guarantee."""
    cwd.mkdir()
    result = run_cli(["validate", *configs(*layout), *extra, "--ckpt_path", weights], cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(cwd)
    (loss,) = read_scalars(run)["val/loss"]
    return loss[1], read_plan(run)["guarantees"]["validation"]


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_limit_val_batches_gives_the_same_val_loss_on_1_2_and_4_processes(weights, tmp_path):
    """3 batches of 64 = the first 192 of the 270 validation samples, whatever the processes; 0.7 of 5 batches is 3."""
    limit = ["--trainer.limit_val_batches", "3"]
    (one, one_plan), (whole, _), (two, two_plan), (four, four_plan) = two_at_a_time(
        partial(_validate, weights, tmp_path / "one", (), *limit),
        partial(_validate, weights, tmp_path / "whole", ()),
        partial(_validate, weights, tmp_path / "two", ("--config", CPU_DDP), "--trainer.limit_val_batches", "0.7"),
        partial(_validate, weights, tmp_path / "four", ("--config", CPU_DDP), "--parallel.devices", "4", *limit),
    )
    assert two == pytest.approx(one, abs=1e-6) and four == pytest.approx(one, abs=1e-6), (one, two, four)
    assert abs(whole - one) > 1e-4, (whole, one)
    assert one_plan["limit"] == {
        "setting": "limit_val_batches", "value": 3, "batches": 3, "batch_size": 64, "samples": 192, "of": 270,
        "per_process": [192],
    }  # fmt: skip
    assert two_plan["limit"]["samples"] == 192 and two_plan["limit"]["per_process"] == [96, 96]
    assert four_plan["limit"]["per_process"] == [48, 48, 48, 48] and "the first 192 of the 270" in four_plan["detail"]


@pytest.mark.distributed
@pytest.mark.skipif(not has_layer("predictions"), reason="predictions.csv is the predictions layer's")
def test_limit_predict_batches_writes_the_first_samples_once_on_two_processes(weights, tmp_path):
    args = ["predict", *configs("--config", CPU_DDP), "--ckpt_path", weights]
    result = run_cli([*args, "--trainer.limit_predict_batches", "2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    with open(run / "predictions.csv") as file:
        assert [int(row["index"]) for row in csv.DictReader(file)] == list(range(128))
    assert read_plan(run)["guarantees"]["predict"]["limit"]["per_process"] == [64, 64]


def test_an_unreachable_val_check_interval_is_one_line_before_training(tmp_path):
    """19 global batches an epoch (1,257 samples in batches of 64): validation every 25 would never run."""
    (tmp_path / "fit").mkdir()
    (tmp_path / "plan").mkdir()
    fit, plan = two_at_a_time(
        partial(run_cli, ["fit", *QUIET, "--trainer.val_check_interval", "25"], tmp_path / "fit"),
        partial(run_cli, ["plan", *QUIET, "--trainer.val_check_interval", "25"], tmp_path / "plan"),
    )
    for result in (fit, plan):
        output = result.stdout + result.stderr
        assert result.returncode == 2 and "Traceback" not in output, output[-3000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "val_check_interval=25 is more than the 19 training batches" in errors[0], output
    assert list((tmp_path / "fit").iterdir()) == []  # nothing written


# After the configs (a layout config's `parallel:` would replace --parallel.global_batch_size).
STREAM = ["--data.class_path", "user_code.StreamedDigits", "--parallel.global_batch_size", "128"]
STREAM += ["--trainer.limit_val_batches", "2", "--test_after_fit", "false", "--trainer.max_epochs", "1"]


@pytest.mark.distributed
def test_a_stream_shorter_than_limit_train_batches_is_validated_at_its_end(tmp_path):
    """1,707 samples in global batches of 128 are 13 batches: a limit of 100 would never reach validation.

    On 2 processes, which must all validate at the same batch (each reads the whole stream); one line says it.
    """
    (tmp_path / "long").mkdir()
    (tmp_path / "cut").mkdir()
    long, cut = two_at_a_time(
        partial(
            run_cli,
            ["fit", *configs("--config", CPU_DDP), *STREAM, "--trainer.limit_train_batches", "100"],
            tmp_path / "long",
        ),
        partial(run_cli, ["fit", *QUIET, *STREAM, "--trainer.limit_train_batches", "5"], tmp_path / "cut"),
    )
    assert long.returncode == 0 and cut.returncode == 0, long.stderr[-3000:] + cut.stderr[-3000:]
    lines = [line for line in long.stderr.splitlines() if line.startswith("warning: the training stream ended")]
    assert len(lines) == 1 and "after 13 global batches" in lines[0] and "limit_train_batches=100" in lines[0], lines
    (run,) = run_dirs(tmp_path / "long")
    assert [step for step, _ in read_scalars(run)["val/loss"]] == [12]
    assert any(path.name.startswith("best-") for path in (run / "checkpoints").iterdir())
    training = read_plan(run)["guarantees"]["training"]
    assert training["limit"]["samples"] == 12800 and "at most 100 global batches of 128" in training["detail"]
    # An epoch cut by the limit is over: a resumed run starts the next one at the stream's start, skipping nothing.
    (cut_run,) = run_dirs(tmp_path / "cut")
    state = torch.load(cut_run / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    assert state["LoaderGuaranteesCallback"]["stream_exhausted"] is True
    assert "warning: the training stream ended" not in cut.stderr


def test_plan_says_how_many_samples_each_limit_means(tmp_path):
    args = ["plan", *configs("--config", CPU_DDP), "--json", "--trainer.limit_train_batches", "5"]
    args += ["--trainer.limit_val_batches", "3", "--trainer.limit_test_batches", "0.5"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    limits = json.loads(result.stdout)["limits"]
    # 2 processes x 64: 9 global batches of 128 an epoch (1,257 samples).
    assert limits["training"] == training_limit(5, 9, 128).to_dict() and limits["training"]["samples"] == 640
    assert (limits["validation"]["samples"], limits["validation"]["per_process"]) == (192, [96, 96])
    assert (limits["test"]["batches"], limits["test"]["samples"]) == (2, 128)  # int(5 x 0.5) batches of 64
    assert limits["predict"]["samples"] == limits["predict"]["of"] == 270
    assert not re.search(r"error|Traceback", result.stderr)


# No batch-coupled layers: the weights then agree at any world size within float noise (docs/parallel.md).
PLAIN_NET = ["--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm", "false"]


def _overfit(cwd: Path, layout: tuple[str, ...]) -> tuple[dict, list, dict]:
    """``fit`` with ``overfit_batches 2`` at global batch 64: last.ckpt, the val/loss curve, plan.json's guarantees."""
    cwd.mkdir()
    args = [
        "fit",
        *configs(*layout),
        "--trainer.overfit_batches",
        "2",
        "--parallel.global_batch_size",
        "64",
        *PLAIN_NET,
    ]
    result = run_cli([*args, "--trainer.max_epochs", "2", "--test_after_fit", "false"], cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "overfit" not in result.stderr  # Lightning's "turning off the shuffling" warning: ours are in order
    (run,) = run_dirs(cwd)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    return state, read_scalars(run)["val/loss"], read_plan(run)["guarantees"]


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_overfit_batches_trains_and_evaluates_the_same_samples_once_on_1_and_2_processes(tmp_path):
    (one, one_loss, one_plan), (two, two_loss, two_plan) = two_at_a_time(
        partial(_overfit, tmp_path / "one", ()), partial(_overfit, tmp_path / "two", ("--config", CPU_DDP))
    )
    for key, value in one["state_dict"].items():
        assert torch.allclose(two["state_dict"][key], value, atol=1e-5), key
    assert [s for s, _ in two_loss] == [s for s, _ in one_loss]
    assert [v for _, v in two_loss] == pytest.approx([v for _, v in one_loss], abs=1e-5)
    # 2 batches of 64 validation samples: the first 128, each once, over the processes; training in order.
    assert one_plan["validation"]["limit"]["per_process"] == [128]
    assert two_plan["validation"]["limit"]["per_process"] == [64, 64]
    assert "in order" in two_plan["training"]["detail"] and "2 global batches of 64" in two_plan["training"]["detail"]
