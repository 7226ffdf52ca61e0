"""Tied weights under fsdp (every GPT-style LM ties its input and output embeddings), as users write them.

The tie inside one network trains, and consolidates, exactly as under ddp (float64); a tie across two networks of
the LightningModule, which fsdp shards one by one, is one line before training, nothing left behind.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, CPU_DDP, REPO, assert_clean_error, run_cli, run_dirs, two_at_a_time

FSDP = str(CONFIGS / "sharding" / "cpu_fsdp.yaml")
CONFIG = """
seed_everything: 1
model: {class_path: user_tied.MODEL}
data: {class_path: user_tied.Tokens}
trainer:
  max_epochs: 2
  enable_progress_bar: false
  enable_model_summary: false
  logger: {class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: logs, name: tied}}

"""
ENV = {"PYTHONPATH": str(REPO / "tests" / "extras" / "sharding")}


def _fit(cwd: Path, model: str, layout: str):
    cwd.mkdir()
    (cwd / "tied.yaml").write_text(CONFIG.replace("MODEL", model))
    args = ["fit", "--config", "tied.yaml", "--config", layout, "--parallel.precision", "64"]
    args += ["--test_after_fit", "false"]
    return run_cli(args, cwd, env=ENV, timeout=300), cwd


@pytest.mark.timeout(600)
def test_a_tie_inside_one_network_trains_as_under_ddp_and_one_across_networks_is_one_line(tmp_path):
    (ddp, ddp_dir), (fsdp, fsdp_dir), (across, across_dir) = two_at_a_time(
        partial(_fit, tmp_path / "ddp", "TiedNetLM", CPU_DDP),
        partial(_fit, tmp_path / "fsdp", "TiedNetLM", FSDP),
        partial(_fit, tmp_path / "across", "TiedLM", FSDP),
    )
    assert ddp.returncode == 0 and fsdp.returncode == 0, (ddp.stderr[-2000:], fsdp.stderr[-2000:])
    (sharded,) = (run_dirs(fsdp_dir, "tied")[0] / "checkpoints").glob("*.ckpt")
    merged = tmp_path / "merged.ckpt"
    done = run_cli(["consolidate", str(sharded), "--out", str(merged)], tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    (plain,) = (run_dirs(ddp_dir, "tied")[0] / "checkpoints").glob("*.ckpt")
    want = torch.load(plain, weights_only=True)["state_dict"]
    got = torch.load(merged, weights_only=True)["state_dict"]
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.allclose(got[key], value, atol=1e-12), key
    assert torch.equal(got["net.head.weight"], got["net.embed.weight"])  # still one weight
    assert_clean_error(across, "TiedLM ties weights across the networks embed, head (head.weight is embed.weight)")
    assert not (across_dir / "logs" / "tied").exists() or not any((across_dir / "logs" / "tied").iterdir())
