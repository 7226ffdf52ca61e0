"""Lightning's own trainer settings beside the ``parallel`` section: taken when they mean one of its settings."""

from __future__ import annotations

import torch
import yaml

from helpers import DIGITS, FAST, run_cli, run_dirs

SHORT = ["--trainer.max_steps", "6", "--trainer.limit_val_batches", "0", "--test_after_fit", "false"]


def _trained(tmp_path, name, *options):
    cwd = tmp_path / name
    cwd.mkdir()
    result = run_cli(["fit", "--config", DIGITS, "--config", FAST, *SHORT, *options], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = run_dirs(cwd)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    return result, run, state


def test_trainer_accumulate_grad_batches_trains_as_parallel_accumulation(tmp_path):
    taken, run, got = _trained(tmp_path, "trainer", "--trainer.accumulate_grad_batches", "2")
    _, _, want = _trained(tmp_path, "parallel", "--parallel.accumulation", "2")
    assert "note: trainer.accumulate_grad_batches=2 is taken as parallel.accumulation: 2" in taken.stderr
    assert got["global_step"] == want["global_step"] == 6
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["parallel"]["accumulation"] == 2 and saved["trainer"]["accumulate_grad_batches"] == 1
