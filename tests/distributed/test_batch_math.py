"""Issue 13 from the command line: accumulation in `plan`, and random
augmentation that is the same at any world size and number of loader workers."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, run_cli, run_dirs, two_at_a_time


def test_plan_shows_the_accumulation_a_capped_device_batch_needs(tmp_path):
    args = ["plan", "--config", DIGITS, "--assume_gpus", "8", "--parallel.scenario", "ddp", "--json"]
    args += ["--parallel.global_batch_size", "1024", "--parallel.per_device_batch_size", "32"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(result.stdout)
    assert (plan["world_size"], plan["per_device_batch_size"], plan["accumulation"]) == (8, 32, 4)
    assert any("4 micro-batches of 32" in note for note in plan["notes"])


@pytest.mark.distributed
def test_seeded_augmentation_is_the_same_at_any_world_size_and_number_of_workers(tmp_path):
    common = ["--data.class_path", "user_code.AugmentedDigits", "--parallel.global_batch_size", "32"]
    common += ["--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm", "false"]
    common += ["--trainer.max_epochs", "2", "--test_after_fit", "false", "--trainer.limit_val_batches", "1"]
    plain = ["--data.class_path", "user_code.PlainDigits"]  # the same data, not augmented
    runs = {
        "one": ([], ["--data.init_args.workers", "0"]),
        "two": (["--config", CPU_DDP], ["--data.init_args.workers", "1"]),
        "unaugmented": ([], plain),
    }
    for name in runs:
        (tmp_path / name).mkdir()
    results = two_at_a_time(
        *(
            partial(run_cli, ["fit", "--config", DIGITS, *layout, "--config", FAST, *common, *data], tmp_path / name)
            for name, (layout, data) in runs.items()
        )
    )
    weights = []
    for name, result in zip(runs, results, strict=True):
        assert result.returncode == 0, result.stderr[-3000:]
        (run,) = run_dirs(tmp_path / name)
        weights.append(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    one, two, unaugmented = weights
    # 106 AdamW steps from batches of 32 vs two shards of 16: float32 rounding grows to about 1.3e-6 on some
    # CPUs (measured, the same before and after this test's code changed); a wrong augmentation moves weights
    # by far more than 1e-5 (the unaugmented run below differs by over 1e-4).
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5, msg=key)
    assert not torch.allclose(one["net.layers.0.weight"], unaugmented["net.layers.0.weight"], atol=1e-4)
